/* anyshape.h: the C API of anyshape's model modules.
 *
 * A model module (from `anyshape compile` or the Python package's `anyshape.compile`)
 * runs for any value of its dims — in the range it was compiled for or past it. Link
 * with -lanyshape (libanyshape.so, or libanyshape.a with -lgomp -lm -ldl -lpthread).
 *
 *   anyshape_model *m;
 *   if (anyshape_model_load("bert.module", &m) != ANYSHAPE_OK) {
 *       fprintf(stderr, "%s\n", anyshape_last_error());
 *   }
 *   anyshape_tensor in[3] = {...}, out[2] = {...};   // caller's buffers
 *   anyshape_model_run(m, in, 3, out, 2);
 *   anyshape_model_free(m);
 *
 * Every function returning int returns ANYSHAPE_OK or an error code; the message of the
 * last error on this thread is anyshape_last_error(). A model may be run from several
 * threads at once.
 */
#ifndef ANYSHAPE_H
#define ANYSHAPE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. */
#define ANYSHAPE_OK 0
#define ANYSHAPE_INVALID_ARGUMENT 1 /* the caller's input: arguments, inputs, shapes */
#define ANYSHAPE_MODULE_ERROR 2     /* not a module, damaged, another version or CPU */
#define ANYSHAPE_OUT_OF_MEMORY 3    /* a run too large for the machine */
#define ANYSHAPE_BUFFER_TOO_SMALL 4 /* an output buffer holds less than the output */
#define ANYSHAPE_ERROR 5            /* anything else (the message says what) */

/* Element types (ONNX's codes). */
typedef enum {
    ANYSHAPE_FLOAT32 = 1,
    ANYSHAPE_INT64 = 7,
    ANYSHAPE_BOOL = 9, /* one byte per element, 0 or 1 */
} anyshape_dtype;

/* The largest rank of an input or output. */
#define ANYSHAPE_MAX_RANK 8

/* A tensor in the caller's memory, row-major. As an input: `data` holds the elements
 * (its dims give the model's dims their values). As an output: `data` is a buffer of
 * `capacity` bytes, and a run fills `dtype`, `rank` and `dims`. */
typedef struct {
    anyshape_dtype dtype;
    size_t rank;
    int64_t dims[ANYSHAPE_MAX_RANK];
    void *data;
    size_t capacity; /* outputs: the buffer's bytes; inputs: ignored */
} anyshape_tensor;

typedef struct anyshape_model anyshape_model;

/* Load the model module in directory `path`. */
int anyshape_model_load(const char *path, anyshape_model **model);

/* Free a model (NULL is ignored). */
void anyshape_model_free(anyshape_model *model);

/* How many inputs and outputs the model has. */
size_t anyshape_model_num_inputs(const anyshape_model *model);
size_t anyshape_model_num_outputs(const anyshape_model *model);

/* Input (or output) `index`: its name, element type and rank. The name lives as long as
 * the model. */
int anyshape_model_input(const anyshape_model *model, size_t index, const char **name,
                         anyshape_dtype *dtype, size_t *rank);
int anyshape_model_output(const anyshape_model *model, size_t index, const char **name,
                          anyshape_dtype *dtype, size_t *rank);

/* Dim `dim` of input (or output) `index` as text: a number ("64"), a dim's name
 * ("sequence") or an expression over the dims ("batch*sequence"). Lives as long as the
 * model. */
const char *anyshape_model_input_dim(const anyshape_model *model, size_t index, size_t dim);
const char *anyshape_model_output_dim(const anyshape_model *model, size_t index, size_t dim);

/* Run the model: `inputs` in the model's input order (their dims set the model's dims),
 * `outputs` the caller's buffers in the model's output order. On ANYSHAPE_OK each
 * output's dtype, rank and dims are set and its elements written. */
int anyshape_model_run(anyshape_model *model, const anyshape_tensor *inputs, size_t num_inputs,
                       anyshape_tensor *outputs, size_t num_outputs);

/* The message of the last error on this thread ("" if none). Valid until the next call
 * on this thread. */
const char *anyshape_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* ANYSHAPE_H */
