"""The tandem module on a tiny synthetic model: generation, text, NumPy logits, reports, errors.

Run with the module's folder on the path:
    PYTHONPATH=build/cpu/python python3 -m pytest python/tests
"""
import pathlib
import subprocess

import numpy as np
import pytest

import tandem


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    # The `tandem` command built beside the module writes the model.
    cli = pathlib.Path(tandem.__file__).resolve().parent.parent / "bin" / "tandem"
    path = tmp_path_factory.mktemp("model") / "tiny.gguf"
    subprocess.run([str(cli), "synth", "--preset", "tiny", "--type", "f32", "--seed", "4",
                    "-t", "1", "-o", str(path)], check=True, capture_output=True)
    return str(path)


@pytest.fixture(scope="module")
def model(model_path):
    return tandem.Model(model_path, strategy="cpu", n_ctx=64, no_calibrate=True)


def test_greedy_generation_is_repeatable_and_streams_every_token(model):
    pieces = []
    text = model.generate("once upon", n_predict=8, temperature=0.0,
                          callback=lambda token, piece: pieces.append((token, piece)))
    assert text == "".join(piece for _, piece in pieces)
    assert 0 < len(pieces) <= 8
    assert model.generate("once upon", n_predict=8, temperature=0.0) == text


def test_a_callback_returning_false_stops(model):
    seen = []

    def first_only(token, piece):
        seen.append(token)
        return False

    model.generate("abc", n_predict=10, temperature=0.0, callback=first_only)
    assert len(seen) == 1


def test_text_round_trips(model):
    ids = model.tokenize("hello world", add_bos=False)
    assert all(isinstance(i, int) for i in ids)
    assert model.detokenize(ids) == "hello world"
    assert model.tokenize("hello world")[1:] == ids  # after the BOS token


def test_logits_are_numpy_and_match_step_by_step(model):
    tokens = [1, 7, 42, 99]
    every = model.logits(tokens, all=True)
    assert isinstance(every, np.ndarray) and every.dtype == np.float32
    assert every.shape == (4, model.n_vocab)
    last = model.logits(tokens)
    assert last.shape == (model.n_vocab,)
    np.testing.assert_allclose(last, every[-1], rtol=1e-4, atol=1e-4)
    model.reset()
    model.eval(tokens[:-1])
    stepped = model.eval(tokens[-1:])
    np.testing.assert_allclose(stepped, every[-1], rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(model.logits(), stepped)
    assert model.n_past == 4


def test_placement_and_telemetry_are_dicts(model):
    model.logits([1, 2, 3])
    placement = model.placement()
    assert isinstance(placement, dict)
    assert [p["name"] for p in placement["phases"]] == ["prefill", "decode"]
    assert placement["last_step"]["cpu"] > 0
    telemetry = model.telemetry()
    assert telemetry["tokens"]["evaluated"] > 0
    assert telemetry["backends"]["cpu"]["ops"] > 0


def test_errors_are_tandem_errors(model_path, model):
    with pytest.raises(tandem.Error, match="missing.gguf"):
        tandem.Model(model_path + ".missing.gguf")
    with pytest.raises(tandem.Error, match="gpu_mem"):
        tandem.Model(model_path, gpu_mem="lots")
    with pytest.raises(tandem.Error, match="vocabulary"):
        model.logits([model.n_vocab])
    assert isinstance(tandem.Error("x"), RuntimeError)


def test_gpu_options_are_accepted_without_a_gpu(model_path):
    m = tandem.Model(model_path, strategy="auto", gpu_mem="1GiB", n_ctx=32, no_calibrate=True)
    assert m.generate("hi", n_predict=2, temperature=0.0) is not None
