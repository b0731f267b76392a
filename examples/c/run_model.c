/* Run an anyshape model module from C: load it, describe its inputs and outputs, make
 * inputs at the dims given on the command line (int64 inputs all 1 — valid token ids,
 * masks and token types —, bool inputs true, float inputs 0.5), run it into the
 * caller's buffers, and print each output's shape, first elements and sum.
 *
 *   cc run_model.c -Icrates/anyshape-capi/include -Ltarget/release -lanyshape -o run_model
 *   ./run_model bert.module batch=1 sequence=37
 *   ./run_model gpt2.module batch=1 sequence=5 past_sequence=0   # a decoder, no past yet
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>

#include "anyshape.h"

/* The value of the dim named by the `n` characters at `name`: NAME=VALUE among the
 * arguments. */
static int64_t named(const char *name, size_t n, int argc, char **argv) {
    for (int a = 2; a < argc; a++)
        if (strncmp(argv[a], name, n) == 0 && argv[a][n] == '=') return atoll(argv[a] + n + 1);
    fprintf(stderr, "give the dim %.*s as %.*s=VALUE\n", (int)n, name, (int)n, name);
    exit(2);
}

/* A dim's text is a number, a dim's name or an expression over the dims (a decoder's
 * mask is `past_sequence + sequence`): sums and differences of products and quotients
 * (rounded down) of numbers, names and parenthesized expressions. */
static int64_t sum(const char **p, int argc, char **argv);

static void blanks(const char **p) {
    while (**p == ' ') (*p)++;
}

static int64_t atom(const char **p, int argc, char **argv) {
    blanks(p);
    if (**p == '(') {
        (*p)++;
        int64_t v = sum(p, argc, argv);
        blanks(p);
        if (**p == ')') (*p)++;
        return v;
    }
    if (**p == '-') {
        (*p)++;
        return -atom(p, argc, argv);
    }
    const char *start = *p;
    if (isdigit((unsigned char)**p)) {
        while (isdigit((unsigned char)**p)) (*p)++;
        return atoll(start);
    }
    while (isalnum((unsigned char)**p) || **p == '_' || **p == '.') (*p)++;
    return named(start, (size_t)(*p - start), argc, argv);
}

static int64_t product(const char **p, int argc, char **argv) {
    int64_t v = atom(p, argc, argv);
    for (blanks(p); **p == '*' || **p == '/'; blanks(p)) {
        char op = *(*p)++;
        int64_t r = atom(p, argc, argv);
        if (op == '*') v *= r;
        else if (r != 0) v = v / r - ((v % r != 0) && ((v < 0) != (r < 0)));
    }
    return v;
}

static int64_t sum(const char **p, int argc, char **argv) {
    int64_t v = product(p, argc, argv);
    for (blanks(p); **p == '+' || **p == '-'; blanks(p)) {
        char op = *(*p)++;
        int64_t r = product(p, argc, argv);
        v = op == '+' ? v + r : v - r;
    }
    return v;
}

static int64_t dim_value(const char *text, int argc, char **argv) {
    return sum(&text, argc, argv);
}

static size_t width(anyshape_dtype t) { return t == ANYSHAPE_INT64 ? 8 : t == ANYSHAPE_BOOL ? 1 : 4; }

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODULE [DIM=VALUE ...]\n", argv[0]);
        return 2;
    }
    anyshape_model *m = NULL;
    if (anyshape_model_load(argv[1], &m) != ANYSHAPE_OK) {
        fprintf(stderr, "error: %s\n", anyshape_last_error());
        return 1;
    }
    size_t ni = anyshape_model_num_inputs(m), no = anyshape_model_num_outputs(m);
    anyshape_tensor *in = calloc(ni, sizeof *in), *out = calloc(no, sizeof *out);
    for (size_t i = 0; i < ni; i++) {
        const char *name;
        anyshape_dtype t;
        size_t rank, n = 1;
        anyshape_model_input(m, i, &name, &t, &rank);
        in[i].dtype = t;
        in[i].rank = rank;
        printf("input  %s [", name);
        for (size_t d = 0; d < rank; d++) {
            const char *text = anyshape_model_input_dim(m, i, d);
            in[i].dims[d] = dim_value(text, argc, argv);
            n *= (size_t)in[i].dims[d];
            printf("%s%s=%lld", d ? ", " : "", text, (long long)in[i].dims[d]);
        }
        printf("]\n");
        in[i].data = malloc(n * width(t) + 1);
        for (size_t k = 0; k < n; k++) {
            if (t == ANYSHAPE_INT64) ((int64_t *)in[i].data)[k] = 1;
            else if (t == ANYSHAPE_BOOL) ((unsigned char *)in[i].data)[k] = 1;
            else ((float *)in[i].data)[k] = 0.5f;
        }
    }
    for (size_t o = 0; o < no; o++) {
        out[o].capacity = 64u << 20;
        out[o].data = malloc(out[o].capacity);
    }
    int status = anyshape_model_run(m, in, ni, out, no);
    if (status != ANYSHAPE_OK) {
        fprintf(stderr, "error %d: %s\n", status, anyshape_last_error());
        return 1;
    }
    for (size_t o = 0; o < no; o++) {
        const char *name;
        anyshape_model_output(m, o, &name, NULL, NULL);
        size_t n = 1;
        printf("output %s [", name);
        for (size_t d = 0; d < out[o].rank; d++) {
            n *= (size_t)out[o].dims[d];
            printf("%s%lld", d ? ", " : "", (long long)out[o].dims[d]);
        }
        printf("]");
        if (out[o].dtype == ANYSHAPE_FLOAT32) {
            const float *v = out[o].data;
            double sum = 0;
            for (size_t k = 0; k < n; k++) sum += v[k];
            printf(" first");
            for (size_t k = 0; k < n && k < 4; k++) printf(" %.6f", v[k]);
            printf(" sum %.6f", sum);
        }
        printf("\n");
        free(out[o].data);
    }
    for (size_t i = 0; i < ni; i++) free(in[i].data);
    free(in);
    free(out);
    anyshape_model_free(m);
    return 0;
}
