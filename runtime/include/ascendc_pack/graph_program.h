/* ascendc_pack/graph_program.h - the program a generated graph.cpp holds.
 *
 * graph.cpp is data only: the tensor specs of weights and inputs, the operators with their
 * constant arguments, the kernel libraries (with the kernel_key each must report) and two
 * instruction lists, `init` (run once when the graph is loaded) and `run` (every call). The
 * interpreter in ascendc_pack/graph_interp.h executes them; it is compiled once per toolchain
 * and linked into every graph.so. This header includes no torch header, so a graph.cpp
 * compiles in a fraction of a second.
 *
 * Registers of the interpreter (ap_ref): the call's inputs, the weights, the static tensors of
 * the graph state (planned buffers and views computed at load) and the locals of one call.
 */
#ifndef ASCENDC_PACK_GRAPH_PROGRAM_H_
#define ASCENDC_PACK_GRAPH_PROGRAM_H_

#include <stdint.h>

#define AP_GRAPH_PROGRAM_VERSION 3 /* layout of the structs below (2: dynamic dims, 3: flush_denormals) */

#if defined(__GNUC__)
#define AP_GRAPH_HIDDEN __attribute__((visibility("hidden")))
#else
#define AP_GRAPH_HIDDEN
#endif

/* ---- tensors ---------------------------------------------------------------------------- */

enum ap_space : int32_t { AP_NOWHERE = 0, AP_INPUT = 1, AP_WEIGHT = 2, AP_STATIC = 3, AP_LOCAL = 4 };

struct ap_ref {
  int32_t space; /* ap_space */
  int32_t index;
};

#define AP_NIL ap_ref{AP_NOWHERE, 0}
#define AP_IN(i) ap_ref{AP_INPUT, (i)}
#define AP_W(i) ap_ref{AP_WEIGHT, (i)}
#define AP_S(i) ap_ref{AP_STATIC, (i)}
#define AP_L(i) ap_ref{AP_LOCAL, (i)}

/* c10::ScalarType values (the interpreter checks them with static_assert) */
enum ap_dtype : int32_t {
  AP_Byte = 0, AP_Char = 1, AP_Short = 2, AP_Int = 3, AP_Long = 4, AP_Half = 5, AP_Float = 6,
  AP_Double = 7, AP_ComplexFloat = 9, AP_ComplexDouble = 10, AP_Bool = 11, AP_BFloat16 = 15,
};

enum ap_memory_format : int32_t { AP_Contiguous = 0, AP_Preserve, AP_ChannelsLast, AP_ChannelsLast3d };

struct ap_tensor_spec {
  const char* name;
  int32_t dtype; /* ap_dtype */
  int32_t ndim;
  const int64_t* sizes;
  const int64_t* strides;
};

/* ---- operator arguments ------------------------------------------------------------------ */

enum ap_arg_kind : int32_t {
  AP_ARG_NONE = 0,
  AP_ARG_INT, AP_ARG_DOUBLE, AP_ARG_BOOL, AP_ARG_STRING,
  AP_ARG_INTS, AP_ARG_DOUBLES, AP_ARG_BOOLS,
  AP_ARG_DTYPE, AP_ARG_LAYOUT_STRIDED, AP_ARG_MEMORY_FORMAT, AP_ARG_DEVICE_CPU,
  AP_ARG_WRAPPED_INT, AP_ARG_WRAPPED_DOUBLE, AP_ARG_WRAPPED_BOOL, /* a number passed as a Tensor */
  AP_ARG_TENSOR, AP_ARG_TENSORS, AP_ARG_OPTIONAL_TENSORS,         /* registers, read per use */
  AP_ARG_OPTIONAL_SCALARS,  /* an empty Scalar?[] (the post-op scalars of oneDNN tactic ops) */
};

struct ap_arg {
  int32_t kind; /* ap_arg_kind */
  int32_t n;    /* items of a list */
  int64_t i;    /* INT, BOOL, DTYPE, MEMORY_FORMAT, WRAPPED_INT, WRAPPED_BOOL */
  double d;     /* DOUBLE, WRAPPED_DOUBLE */
  const void* items; /* STRING: char[]; INTS: int64_t[n]; DOUBLES: double[n]; BOOLS: bool[n];
                        TENSORS, OPTIONAL_TENSORS: ap_ref[n] (AP_NIL: an empty optional) */
  ap_ref t;     /* TENSOR */
};

#define AP_NAN __builtin_nan("")
#define AP_INF __builtin_inf()

#define AP_A_NONE ap_arg{AP_ARG_NONE, 0, 0, 0.0, nullptr, AP_NIL}
#define AP_A_INT(v) ap_arg{AP_ARG_INT, 0, (v), 0.0, nullptr, AP_NIL}
#define AP_A_DOUBLE(v) ap_arg{AP_ARG_DOUBLE, 0, 0, (v), nullptr, AP_NIL}
#define AP_A_BOOL(v) ap_arg{AP_ARG_BOOL, 0, (v), 0.0, nullptr, AP_NIL}
#define AP_A_STRING(s) ap_arg{AP_ARG_STRING, 0, 0, 0.0, (s), AP_NIL}
#define AP_A_LIST(kind, n, items) ap_arg{(kind), (n), 0, 0.0, (items), AP_NIL}
#define AP_A_DTYPE(x) ap_arg{AP_ARG_DTYPE, 0, AP_##x, 0.0, nullptr, AP_NIL}
#define AP_A_LAYOUT_STRIDED ap_arg{AP_ARG_LAYOUT_STRIDED, 0, 0, 0.0, nullptr, AP_NIL}
#define AP_A_MEMORY_FORMAT(x) ap_arg{AP_ARG_MEMORY_FORMAT, 0, AP_##x, 0.0, nullptr, AP_NIL}
#define AP_A_DEVICE_CPU ap_arg{AP_ARG_DEVICE_CPU, 0, 0, 0.0, nullptr, AP_NIL}
#define AP_A_WRAPPED_INT(v) ap_arg{AP_ARG_WRAPPED_INT, 0, (v), 0.0, nullptr, AP_NIL}
#define AP_A_WRAPPED_DOUBLE(v) ap_arg{AP_ARG_WRAPPED_DOUBLE, 0, 0, (v), nullptr, AP_NIL}
#define AP_A_WRAPPED_BOOL(v) ap_arg{AP_ARG_WRAPPED_BOOL, 0, (v), 0.0, nullptr, AP_NIL}
#define AP_A_TENSOR(r) ap_arg{AP_ARG_TENSOR, 0, 0, 0.0, nullptr, r}

/* An operator: its schema name and every argument in schema order; tensor arguments are
 * AP_A_NONE here and filled in at load (tensors that never change) or per call. */
struct ap_op {
  const char* name;     /* "aten::addmm" */
  const char* overload; /* "" for the default overload */
  int32_t nargs;
  const ap_arg* args;
};

/* A fused kernel library, found relative to the bundle root and checked at load. */
struct ap_kernel_spec {
  const char* name;
  const char* kernel_key;
  const char* file;
  int64_t workspace;
  int32_t n_inputs;
  int32_t n_outputs;
  int32_t n_dims; /* a jit kernel (kernel_abi.h): the sizes it takes; 0: a static kernel */
};

/* ---- dynamic dims (a generic plan, docs/DESIGN.md §2.10) ------------------------------------
 * A size that is an expression over the graph's dynamic dims is written AP_SYM(k) wherever a
 * size goes (tensor specs, instruction shapes/strides/nbytes, INT and INTS arguments): the value
 * of expression k of the graph's table, evaluated once per call shape. Expression k is postfix
 * code expr_code[expr_offsets[k] .. expr_offsets[k + 1]) of (opcode, operand) pairs: AP_OP_CONST c
 * and AP_OP_DIM d push, the others pop two and push one (ascendc_pack/ir/symbolic.py). */
#define AP_SYM_LIMIT (1 << 24)
#define AP_SYM(k) (INT64_MIN + 1 + (int64_t)(k))
static inline bool ap_is_sym(int64_t v) { return v > INT64_MIN && v <= INT64_MIN + AP_SYM_LIMIT; }

enum ap_sym_op : int64_t {
  AP_OP_CONST = 0, AP_OP_DIM, AP_OP_ADD, AP_OP_MUL, AP_OP_FLOORDIV, AP_OP_MOD, AP_OP_MAX, AP_OP_MIN,
};

struct ap_dim_spec { /* a dynamic dim and its declared range */
  const char* name;
  int64_t min;
  int64_t max;
};

struct ap_dim_bind { /* dim `dim` of input `input` is dynamic dim `sym` */
  int32_t input;
  int32_t dim;
  int32_t sym;
};

/* ---- instructions ------------------------------------------------------------------------ */

enum ap_code : int32_t {
  AP_CALL = 1,  /* call op `a` with its argument template and `args` (per-call arguments, at
                   their schema positions); result k goes to refs[k] (AP_NIL: dropped); b = 1
                   when the op returns one Tensor[] (results are its items) */
  AP_SET_ARG,   /* (init) argument b of op a := args[0] for every later call */
  AP_EMPTY,     /* dst := a new tensor of dtype a, shape/stride */
  AP_ARENA,     /* dst := bytes [offset, offset + nbytes) of the arena as dtype a, shape/stride */
  AP_LAUNCH,    /* launch kernel a: refs[0, b) inputs, refs[b, nrefs) outputs, src workspace */
  AP_RELAYOUT,  /* copy src into dst (dst may be compact along broadcast dims of src) */
  AP_EXPECT,    /* dst := src if it has layout shape/stride, else a copy in that layout */
  AP_MOVE,      /* dst := src */
  AP_COPY,      /* dst.copy_(src): an input mutation written back */
  AP_BRANCH,    /* if not (a < 0 ? truthy(src) : a != 0): jump to instruction b */
  AP_JUMP,      /* jump to instruction b */
  AP_PACK_B,    /* (init) dst := src packed by GEMM kernel a's ap_gemm_pack_b (nbytes, gemm_abi.h) */
};

struct ap_dyn_arg {
  int32_t pos;
  ap_arg arg;
};

struct ap_insn { /* fields left out of an initializer are zero */
  int32_t code = 0; /* ap_code */
  int32_t a = 0;
  int32_t b = 0;
  ap_ref dst = AP_NIL;
  ap_ref src = AP_NIL;
  int32_t ndim = 0;
  const int64_t* shape = nullptr;
  const int64_t* stride = nullptr;
  int64_t offset = 0;
  int64_t nbytes = 0;
  int32_t nargs = 0;
  const ap_dyn_arg* args = nullptr;
  int32_t nrefs = 0;
  const ap_ref* refs = nullptr;
};

/* ---- the graph --------------------------------------------------------------------------- */

struct ap_graph {
  int32_t program_version; /* AP_GRAPH_PROGRAM_VERSION */
  int32_t graph_abi;       /* what the runtime checks (via the signature) */
  const char* ns;          /* operator namespace: <ns>::init/run/release/signature */
  const char* signature;   /* JSON: graph_abi, kernels, io counts */
  int32_t n_weights;
  const ap_tensor_spec* weights;
  int32_t n_inputs;
  const ap_tensor_spec* inputs;
  int32_t n_kernels;
  const ap_kernel_spec* kernels;
  int32_t n_ops;
  const ap_op* ops;
  int64_t arena_bytes;
  int32_t n_static;
  int32_t n_locals;
  int32_t n_init;
  const ap_insn* init;
  int32_t n_run;
  const ap_insn* run;
  int32_t n_returns;
  const ap_ref* returns;
  /* a generic plan (all zero in a static one) */
  int32_t n_dims;
  const ap_dim_spec* dims;
  int32_t n_binds;
  const ap_dim_bind* binds;
  int32_t n_exprs;
  const int32_t* expr_offsets; /* n_exprs + 1 */
  const int64_t* expr_code;
  /* 1: every call runs with denormals flushed to zero (--flush-denormals; fp_mode.h) */
  int32_t flush_denormals;
};

/* Defined by graph.cpp, read by the interpreter. */
extern "C" AP_GRAPH_HIDDEN const ap_graph ap_graph_program;

#endif /* ASCENDC_PACK_GRAPH_PROGRAM_H_ */
