/* Tandem's C API: load a GGUF model, tokenize, evaluate, generate, and read where each op ran.
 *
 * Every call returns a tandem_status; on an error tandem_last_error() says what went wrong, as
 * "[where] what (values)". No C++ exception crosses this interface. A tandem_model is one
 * session (one context): use it from one thread at a time.
 */
#ifndef TANDEM_H
#define TANDEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tandem_status {
  TANDEM_OK = 0,
  TANDEM_ERROR_INVALID_ARGUMENT = 1,
  TANDEM_ERROR_UNSUPPORTED = 2,
  TANDEM_ERROR_OUT_OF_MEMORY = 3,
  TANDEM_ERROR_DEVICE_LOST = 4,
  TANDEM_ERROR_IO = 5,
  TANDEM_ERROR_FORMAT = 6,
  TANDEM_ERROR_BUFFER_TOO_SMALL = 7, /* the size needed is written back; retry with it */
  TANDEM_ERROR_INTERNAL = 8
} tandem_status;

/* The message of the last failed call on this thread ("" when none); valid until the next
 * failing call on this thread. */
const char* tandem_last_error(void);
/* "ok", "invalid_argument", ... */
const char* tandem_status_name(tandem_status status);
/* "0.1.0" */
const char* tandem_version(void);

typedef struct tandem_model tandem_model;

typedef struct tandem_load_options {
  const char* strategy;     /* "gpu" (NULL), "cpu", "auto" or "only:BACKEND" */
  uint64_t gpu_memory;      /* bytes each GPU may hold for weights and KV cache; 0: no limit */
  int32_t n_gpu_layers;     /* llama.cpp's -ngl; -1: unset (the strategy decides) */
  int32_t threads;          /* CPU threads; 0: physical cores */
  int64_t n_ctx;            /* context length; 0: min(trained, 4096) */
  int32_t strict;           /* nonzero: fail instead of falling back to another backend */
  const char* cost_profile; /* a cost profile file; NULL: this machine's, if calibrated */
  int32_t no_calibrate;     /* nonzero: the built-in device figures */
  const char* const* pins;  /* "REGEX=BACKEND" tensor pins, n_pins of them */
  size_t n_pins;
} tandem_load_options;

/* The defaults: strategy gpu, no GPU budget, -ngl unset, every core, context 0. */
void tandem_load_options_init(tandem_load_options* options);

/* Maps the model and plans nothing yet; options may be NULL (the defaults). On success *out
 * holds a model to free with tandem_model_free; on an error *out is NULL. */
tandem_status tandem_model_load(const char* path, const tandem_load_options* options,
                                tandem_model** out);
void tandem_model_free(tandem_model* model);

int32_t tandem_n_vocab(const tandem_model* model);
int64_t tandem_n_ctx(const tandem_model* model);
/* Positions evaluated so far in the context. */
int64_t tandem_n_past(const tandem_model* model);

/* Text to token ids (add_bos: nonzero adds the BOS token). *n_tokens gets the count; when it
 * exceeds capacity nothing is written and TANDEM_ERROR_BUFFER_TOO_SMALL is returned. */
tandem_status tandem_tokenize(const tandem_model* model, const char* text, int32_t add_bos,
                              int32_t* tokens, size_t capacity, size_t* n_tokens);
/* Token ids to text, NUL-terminated; *length gets the length without the NUL. When the text and
 * its NUL exceed capacity nothing is written and TANDEM_ERROR_BUFFER_TOO_SMALL is returned. */
tandem_status tandem_detokenize(const tandem_model* model, const int32_t* tokens, size_t n_tokens,
                                char* text, size_t capacity, size_t* length);

/* Evaluates tokens after the context (a prompt, or one token at a time) and keeps the logits
 * of the last one. */
tandem_status tandem_eval(tandem_model* model, const int32_t* tokens, size_t n_tokens);
/* The logits of the last evaluated token: *n_vocab floats, valid until the next evaluation. */
tandem_status tandem_logits(const tandem_model* model, const float** logits, size_t* n_vocab);
/* Forgets the context. */
void tandem_reset(tandem_model* model);

typedef struct tandem_generate_options {
  int32_t n_predict;    /* tokens to generate; -1: until the end of generation or context */
  float temperature;    /* 0: greedy */
  int32_t top_k;        /* 0: off */
  float top_p;          /* 1: off */
  float min_p;          /* 0: off */
  float repeat_penalty; /* 1: off */
  uint64_t seed;
  int32_t add_bos; /* nonzero: the prompt starts with the BOS token */
} tandem_generate_options;

/* llama.cpp's defaults: 64 tokens, temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, seed 0. */
void tandem_generate_options_init(tandem_generate_options* options);

/* Called for each generated token with the text it completes (NUL-terminated; complete UTF-8
 * characters only). token -1 carries the text held back at the end. Return nonzero to stop. */
typedef int (*tandem_token_callback)(int32_t token, const char* text, void* user_data);

/* From a fresh context: the prompt, then up to n_predict sampled tokens, each passed to
 * on_token (may be NULL). *n_generated (may be NULL) gets the number generated. */
tandem_status tandem_generate(tandem_model* model, const char* prompt,
                              const tandem_generate_options* options,
                              tandem_token_callback on_token, void* user_data,
                              int32_t* n_generated);

/* JSON documents, NUL-terminated, owned by the model and valid until the next call that
 * returns one: where the ops run and what each backend holds, and what the steps measured. */
tandem_status tandem_placement_json(tandem_model* model, const char** json);
tandem_status tandem_telemetry_json(tandem_model* model, const char** json);

#ifdef __cplusplus
}
#endif

#endif /* TANDEM_H */
