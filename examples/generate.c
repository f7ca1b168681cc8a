/* Generates text with Tandem's C API and prints where the ops ran.
 *   tandem-generate-c MODEL.gguf [PROMPT] [N_TOKENS] [STRATEGY]
 */
#include <stdio.h>
#include <stdlib.h>

#include "tandem.h"

static int print_token(int32_t token, const char* text, void* user_data) {
  (void)token;
  fputs(text, stdout);
  fflush(stdout);
  ++*(int*)user_data;
  return 0; /* nonzero would stop the generation */
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL.gguf [PROMPT] [N_TOKENS] [STRATEGY]\n", argv[0]);
    return 2;
  }
  tandem_load_options load;
  tandem_load_options_init(&load);
  load.strategy = argc > 4 ? argv[4] : "auto";
  load.n_ctx = 256;
  tandem_model* model = NULL;
  tandem_status status = tandem_model_load(argv[1], &load, &model);
  if (status != TANDEM_OK) {
    fprintf(stderr, "error (%s): %s\n", tandem_status_name(status), tandem_last_error());
    return 1;
  }

  tandem_generate_options gen;
  tandem_generate_options_init(&gen);
  gen.n_predict = argc > 3 ? atoi(argv[3]) : 16;
  gen.temperature = 0.0f; /* greedy: the same text every run */
  const char* prompt = argc > 2 ? argv[2] : "Once upon a time";
  int pieces = 0;
  int32_t generated = 0;
  fputs(prompt, stdout);
  status = tandem_generate(model, prompt, &gen, print_token, &pieces, &generated);
  if (status != TANDEM_OK) {
    fprintf(stderr, "\nerror (%s): %s\n", tandem_status_name(status), tandem_last_error());
    tandem_model_free(model);
    return 1;
  }
  printf("\n");

  const char* placement = NULL;
  const char* telemetry = NULL;
  if (tandem_placement_json(model, &placement) != TANDEM_OK ||
      tandem_telemetry_json(model, &telemetry) != TANDEM_OK) {
    fprintf(stderr, "error: %s\n", tandem_last_error());
    tandem_model_free(model);
    return 1;
  }
  fprintf(stderr, "generated %d tokens\nplacement: %s\ntelemetry: %s\n", (int)generated, placement,
          telemetry);
  tandem_model_free(model);
  return 0;
}
