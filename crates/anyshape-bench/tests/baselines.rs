//! Every baseline kernel is checked against the reference like anyshape's own: the
//! `gemm` crate builtins, the vendor shims (where the library is installed), and the
//! bucketing wrapper (global padding) around a specialized kernel, over T = 0, 1,
//! primes, the range ends and past them.
use anyshape_abi::{load_library, KernelFn, STATUS_OK, STATUS_WRONG_SHAPE};
use anyshape_bench::{bucket_c, build_vendors, BUILTINS};
use anyshape_codegen::{ContractionKernel, CpuTarget, KernelMode, PaddingStrategy, Program};
use anyshape_ir::{Bindings, Workload};
use anyshape_measure::{
    check_output, random_inputs, reference_output, Builder, KernelSource, Kernels,
};

const WORKLOADS: [&str; 3] = [
    "dense(M=16*T,N=40,K=24)",
    "batch_matmul_nt(B=3,M=T,N=T,K=16)",
    "batch_matmul_nn(B=3,M=T,N=16,K=T)",
];
/// A kernel under test: shape-var values, inputs, output -> status.
type Call<'a> = &'a mut dyn FnMut(&[i64], &[*const f32], *mut f32) -> i32;

const TS: [i64; 10] = [0, 1, 2, 7, 13, 31, 64, 127, 128, 129];

/// Run `call` on the instance `T=t` of `w` and compare with the reference; returns the
/// kernel's status, or panics naming the instance on a wrong result.
fn check(w: &Workload, t: i64, what: &str, call: Call) -> i32 {
    let b = Bindings::from_pairs([("T", t)]);
    let bound = w.bind(&b).unwrap();
    let inputs = random_inputs(w, &bound, 7);
    let views: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
    let reference = reference_output(w, &bound, &views);
    let mut out = vec![f32::NAN; bound.lens[w.inputs.len()]];
    let ins: Vec<*const f32> = inputs.iter().map(|v| v.as_ptr()).collect();
    let status = call(&[t], &ins, out.as_mut_ptr());
    if status == STATUS_OK {
        let r = check_output(&out, &reference);
        assert!(r.passed, "{what} on {w} at T={t}: {r:?}");
    }
    status
}

fn c_kernel(f: KernelFn) -> impl FnMut(&[i64], &[*const f32], *mut f32) -> i32 {
    move |vars, ins, out| {
        let outs = [out];
        // SAFETY: the buffers have the lengths of the bound instance.
        unsafe { f(vars.as_ptr(), ins.as_ptr(), outs.as_ptr()) }
    }
}

#[test]
fn gemm_crate_builtins_are_correct() {
    for w in WORKLOADS {
        let w = Workload::parse(w).unwrap();
        for builtin in BUILTINS {
            for t in TS {
                let bound = w.bind(&Bindings::from_pairs([("T", t)])).unwrap();
                let mut k = (builtin.prepare)(&w, &bound).unwrap();
                let status = check(&w, t, builtin.symbol, &mut |_, ins, out| {
                    k(ins, out).map_or(1, |_| 0)
                });
                assert_eq!(status, 0, "{} on {w} at T={t}", builtin.symbol);
            }
        }
    }
    // An epilogue is refused with a reason, not computed wrongly.
    let w = Workload::parse("dense(M=T,N=8,K=8)+relu").unwrap();
    let bound = w.bind(&Bindings::from_pairs([("T", 3)])).unwrap();
    assert!((BUILTINS[0].prepare)(&w, &bound).is_err());
}

#[test]
fn vendor_shims_are_correct_where_installed() {
    let target = CpuTarget::detect();
    let dir = tempfile::tempdir().unwrap();
    let builder = Builder::new(dir.path());
    for w in WORKLOADS {
        let w = Workload::parse(w).unwrap();
        for lib in build_vendors(&w, &target, &builder) {
            let (path, kernels) = match lib.built {
                Ok((Kernels::Library(path), kernels)) => (path, kernels),
                // The builtins are checked above, in process.
                Ok(_) => continue,
                Err(why) => {
                    eprintln!("skipping {} (unavailable: {why})", lib.vendor);
                    continue;
                }
            };
            // SAFETY: a library the builder just produced from the shims.
            let so = unsafe { load_library(&path) }.unwrap();
            for k in kernels {
                // SAFETY: every shim has the kernel ABI.
                let f = *unsafe { so.get::<KernelFn>(k.symbol.as_bytes()) }.unwrap();
                for t in TS {
                    let status = check(&w, t, &k.name, &mut c_kernel(f));
                    assert_eq!(status, 0, "{} on {w} at T={t}", k.name);
                }
            }
        }
    }
}

#[test]
fn bucketing_pads_any_smaller_instance_to_the_bucket() {
    let target = CpuTarget::detect();
    let dir = tempfile::tempdir().unwrap();
    let lanes = target.lanes_f32();
    let mk = ContractionKernel {
        mr: 3,
        nr: lanes,
        mc: 6,
        nc: 2 * lanes,
        kc: 8,
        uk: 4,
        dot: false,
        pf: false,
        ia: false,
        ib: false,
        vm: false,
        amx: false,
    };
    for (n, w) in WORKLOADS.iter().enumerate() {
        let w = Workload::parse(w).unwrap();
        // 300: large enough that the copies run in OpenMP threads.
        for bucket in [16, 31, 300] {
            let mut inner = Program::symbolic(&w, mk, PaddingStrategy::LocalPad);
            inner.mode = KernelMode::Specialized;
            inner.bindings = Bindings::from_pairs([("T", bucket)]);
            let symbol = format!("as_bucket_{n}_{bucket}");
            let sources = vec![
                KernelSource {
                    symbol: inner.symbol(&target),
                    code: inner.source(&target).unwrap(),
                },
                KernelSource {
                    symbol: symbol.clone(),
                    code: bucket_c(&w, &inner.bindings, &symbol, &inner.symbol(&target)).unwrap(),
                },
            ];
            let lib = Builder::new(dir.path()).build(&target, &sources).unwrap();
            assert!(lib.failed.is_empty(), "{:#?}", lib.failed);
            // SAFETY: a library the builder just produced.
            let so = unsafe { load_library(&lib.path) }.unwrap();
            // SAFETY: the wrapper has the kernel ABI.
            let f = *unsafe { so.get::<KernelFn>(symbol.as_bytes()) }.unwrap();
            // Twice over, so the kept buffers are reused with other shapes.
            for t in [0, 1, 2, 7, 13, bucket, 3, bucket - 1, 1] {
                assert_eq!(check(&w, t, "bucket", &mut c_kernel(f)), 0, "{w} T={t}");
            }
            // Past the bucket: refused, not computed wrongly.
            assert_eq!(
                check(&w, bucket + 1, "bucket", &mut c_kernel(f)),
                STATUS_WRONG_SHAPE
            );
        }
    }
}
