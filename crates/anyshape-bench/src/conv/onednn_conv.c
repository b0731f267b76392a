/* oneDNN's convolution primitive for `anyshape bench --model --conv-kernels` (loaded in
   the bench's process): one convolution set up once (its data reordered into the
   layouts the primitive picks, `format_tag_any`: blocked channels on this CPU), then
   run as often as timed. Bias, and as post-ops a residual sum and ReLU where anyshape's
   kernel has them. A call that can fail returns 0 or 5 (a oneDNN call failed);
   `as_onednn_conv_new` returns NULL. */
#include <dnnl.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  dnnl_engine_t eng;
  dnnl_stream_t str;
  dnnl_primitive_t conv;
  dnnl_memory_t src, wei, bias, dst;
  /* The residual (NCHW) the sum post-op adds, copied; NULL without one. */
  float *residual;
  dnnl_memory_desc_t user_dst;
} as_conv;

static int as_reorder(as_conv *c, dnnl_memory_t from, dnnl_memory_t to) {
  const dnnl_memory_desc_t *a, *b;
  if (dnnl_memory_get_memory_desc(from, &a) != dnnl_success) return 5;
  if (dnnl_memory_get_memory_desc(to, &b) != dnnl_success) return 5;
  dnnl_primitive_desc_t pd;
  if (dnnl_reorder_primitive_desc_create(&pd, a, c->eng, b, c->eng, NULL) != dnnl_success) return 5;
  dnnl_primitive_t r;
  dnnl_status_t st = dnnl_primitive_create(&r, pd);
  dnnl_primitive_desc_destroy(pd);
  if (st != dnnl_success) return 5;
  dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
  st = dnnl_primitive_execute(r, c->str, 2, args);
  if (st == dnnl_success) st = dnnl_stream_wait(c->str);
  dnnl_primitive_destroy(r);
  return st == dnnl_success ? 0 : 5;
}

/* Copy `data`, laid out as `user`, into `to`. */
static int as_load(as_conv *c, const dnnl_memory_desc_t *user, const float *data, dnnl_memory_t to) {
  dnnl_memory_t u;
  if (dnnl_memory_create(&u, user, c->eng, (void *)data) != dnnl_success) return 5;
  int r = as_reorder(c, u, to);
  dnnl_memory_destroy(u);
  return r;
}

void as_onednn_conv_free(as_conv *c) {
  if (!c) return;
  if (c->conv) dnnl_primitive_destroy(c->conv);
  dnnl_memory_t *m[4] = {&c->src, &c->wei, &c->bias, &c->dst};
  for (int i = 0; i < 4; i++)
    if (*m[i]) dnnl_memory_destroy(*m[i]);
  if (c->str) dnnl_stream_destroy(c->str);
  if (c->eng) dnnl_engine_destroy(c->eng);
  free(c->residual);
  free(c);
}

/* Put the residual back into the output (the sum post-op accumulates into it). */
static int as_reset(as_conv *c) {
  return c->residual ? as_load(c, &c->user_dst, c->residual, c->dst) : 0;
}

/* g: n, ci, h, w, co, kh, kw, stride h, w, dilation h, w (ONNX's: 1 is none), pads
   top, left, bottom, right, oh, ow. relu: a ReLU last. x: NCHW, w: OIHW, b: [co],
   residual: NCHW like the output, or NULL. */
as_conv *as_onednn_conv_new(const int64_t *g, int32_t relu, const float *x, const float *w,
                            const float *b, const float *residual) {
  as_conv *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  dnnl_primitive_desc_t pd = NULL;
  int ok = 0;
  do {
    if (dnnl_engine_create(&c->eng, dnnl_cpu, 0) != dnnl_success) break;
    if (dnnl_stream_create(&c->str, c->eng, dnnl_stream_default_flags) != dnnl_success) break;
    dnnl_dims_t src = {g[0], g[1], g[2], g[3]}, wei = {g[4], g[1], g[5], g[6]}, bias = {g[4]},
                dst = {g[0], g[4], g[15], g[16]};
    dnnl_dims_t strides = {g[7], g[8]}, dil = {g[9] - 1, g[10] - 1}, pl = {g[11], g[12]},
                pr = {g[13], g[14]};
    dnnl_memory_desc_t u_src, u_wei, u_bias, a_src, a_wei, a_dst;
    if (dnnl_memory_desc_init_by_tag(&u_src, 4, src, dnnl_f32, dnnl_nchw) != dnnl_success) break;
    if (dnnl_memory_desc_init_by_tag(&u_wei, 4, wei, dnnl_f32, dnnl_oihw) != dnnl_success) break;
    if (dnnl_memory_desc_init_by_tag(&u_bias, 1, bias, dnnl_f32, dnnl_x) != dnnl_success) break;
    if (dnnl_memory_desc_init_by_tag(&c->user_dst, 4, dst, dnnl_f32, dnnl_nchw) != dnnl_success) break;
    if (dnnl_memory_desc_init_by_tag(&a_src, 4, src, dnnl_f32, dnnl_format_tag_any) != dnnl_success) break;
    if (dnnl_memory_desc_init_by_tag(&a_wei, 4, wei, dnnl_f32, dnnl_format_tag_any) != dnnl_success) break;
    if (dnnl_memory_desc_init_by_tag(&a_dst, 4, dst, dnnl_f32, dnnl_format_tag_any) != dnnl_success) break;
    dnnl_convolution_desc_t desc;
    if (dnnl_dilated_convolution_forward_desc_init(&desc, dnnl_forward_inference,
                                                   dnnl_convolution_direct, &a_src, &a_wei,
                                                   &u_bias, &a_dst, strides, dil, pl,
                                                   pr) != dnnl_success)
      break;
    if (dnnl_primitive_attr_create(&attr) != dnnl_success) break;
    if (dnnl_post_ops_create(&po) != dnnl_success) break;
    if (residual && dnnl_post_ops_append_sum(po, 1.0f) != dnnl_success) break;
    if (relu && dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f) != dnnl_success) break;
    if (dnnl_primitive_attr_set_post_ops(attr, po) != dnnl_success) break;
    if (dnnl_primitive_desc_create(&pd, &desc, attr, c->eng, NULL) != dnnl_success) break;
    const dnnl_memory_desc_t *md[4] = {
        dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0),
        dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0),
        dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 1),
        dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0)};
    dnnl_memory_t *mem[4] = {&c->src, &c->wei, &c->bias, &c->dst};
    int made = 1;
    for (int i = 0; i < 4; i++)
      made = made && md[i] && dnnl_memory_create(mem[i], md[i], c->eng, DNNL_MEMORY_ALLOCATE) == dnnl_success;
    if (!made) break;
    if (dnnl_primitive_create(&c->conv, pd) != dnnl_success) {
      c->conv = NULL;
      break;
    }
    if (as_load(c, &u_src, x, c->src) || as_load(c, &u_wei, w, c->wei) || as_load(c, &u_bias, b, c->bias)) break;
    if (residual) {
      size_t bytes = (size_t)(g[0] * g[4] * g[15] * g[16]) * sizeof(float);
      if (!(c->residual = malloc(bytes))) break;
      memcpy(c->residual, residual, bytes);
    }
    ok = as_reset(c) == 0;
  } while (0);
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (po) dnnl_post_ops_destroy(po);
  if (attr) dnnl_primitive_attr_destroy(attr);
  if (!ok) {
    as_onednn_conv_free(c);
    return NULL;
  }
  return c;
}

int32_t as_onednn_conv_run(as_conv *c) {
  dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, c->src}, {DNNL_ARG_WEIGHTS, c->wei},
                             {DNNL_ARG_BIAS, c->bias}, {DNNL_ARG_DST, c->dst}};
  if (dnnl_primitive_execute(c->conv, c->str, 4, args) != dnnl_success) return 5;
  return dnnl_stream_wait(c->str) == dnnl_success ? 0 : 5;
}

/* Touch every cache line of the input (and of the output a residual sum reads), as a
   model's last steps leave them; returns a sum so that the reads stay. */
float as_onednn_conv_warm(as_conv *c) {
  float sum = 0.0f;
  dnnl_memory_t m[2] = {c->src, c->residual ? c->dst : NULL};
  for (int i = 0; i < 2; i++) {
    const dnnl_memory_desc_t *md;
    void *p;
    if (!m[i] || dnnl_memory_get_memory_desc(m[i], &md) != dnnl_success ||
        dnnl_memory_get_data_handle(m[i], &p) != dnnl_success)
      continue;
    const float *f = p;
    size_t n = dnnl_memory_desc_get_size(md) / sizeof(float);
    for (size_t k = 0; k < n; k += 16) sum += f[k];
  }
  return sum;
}

/* The output, NCHW, into `out`. */
int32_t as_onednn_conv_output(as_conv *c, float *out) {
  dnnl_memory_t u;
  if (dnnl_memory_create(&u, &c->user_dst, c->eng, out) != dnnl_success) return 5;
  int r = as_reorder(c, c->dst, u);
  dnnl_memory_destroy(u);
  return r;
}
