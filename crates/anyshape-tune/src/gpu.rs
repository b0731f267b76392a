//! The GPU backend of the joint search: the space of [`GpuMicroKernel`]s bounded by the
//! target's threads, shared memory and registers (never by a shape), features computed
//! from the tiles, the wave model as `f_occ` (slots = SMs × resident blocks per SM, as
//! TSCompiler's), and measurement through NVRTC and the isolated GPU worker.
use crate::backend::run_built;
use crate::{Adaptation, Backend, Factors, Result, TrialBatch, TrialResult};
use anyshape_codegen::{
    GemmView, GpuMicroKernel, GpuProgram, GpuTarget, KernelMode, PaddingStrategy,
};
use anyshape_ir::{Bindings, BoundWorkload, Workload};
use anyshape_measure::Measurer;
use rand::{Rng, RngExt};
use std::collections::BTreeMap;
use std::time::Instant;

/// Block tile sizes (M and N) of the space.
const BLOCK: [u32; 6] = [8, 16, 32, 64, 128, 256];
/// Reduction tile sizes.
const REDUCTION: [u32; 5] = [2, 4, 8, 16, 32];
/// Thread tile sizes (M and N).
const THREAD: [u32; 5] = [1, 2, 4, 8, 16];

/// The GPU backend.
pub struct GpuBackend<'a> {
    target: GpuTarget,
    measurer: &'a Measurer,
    factors: Option<Factors>,
}

impl<'a> GpuBackend<'a> {
    /// The backend for `target` (read from the device, or a JSON description), building
    /// with `measurer`'s builder and timing with its runner (whose worker runs GPU jobs).
    pub fn new(target: &GpuTarget, measurer: &'a Measurer) -> GpuBackend<'a> {
        GpuBackend {
            target: target.clone(),
            measurer,
            factors: None,
        }
    }

    /// The program of a micro-kernel in a batch.
    pub fn program(batch: &TrialBatch<GpuMicroKernel>, mk: GpuMicroKernel) -> GpuProgram {
        let mut p = GpuProgram::symbolic(batch.workload, mk, batch.strategy);
        if let Some(b) = batch.specialize {
            p.mode = KernelMode::Specialized;
            p.bindings = b.clone();
        }
        p
    }

    /// Whether `mk` is in the space: valid on the target and, in a factor-only space,
    /// with block tiles dividing the extents.
    pub fn contains(&self, mk: &GpuMicroKernel) -> bool {
        mk.validate(&self.target).is_ok()
            && self.factors.is_none_or(|f| {
                f.m.is_multiple_of(mk.bm as usize)
                    && f.n.is_multiple_of(mk.bn as usize)
                    && f.k.is_multiple_of(mk.bk as usize)
            })
    }

    /// `mk` if it is in the space, else a sample.
    fn valid_or_sample(&self, mk: GpuMicroKernel, rng: &mut impl Rng) -> GpuMicroKernel {
        if self.contains(&mk) {
            mk
        } else {
            self.sample(rng)
        }
    }
}

fn pick(values: &[u32], rng: &mut impl Rng) -> u32 {
    values[rng.random_range(0..values.len())]
}

/// A neighbour of `x` in `values` (one step up or down).
fn step(values: &[u32], x: u32, rng: &mut impl Rng) -> u32 {
    let i = values.iter().position(|&v| v == x).unwrap_or(0);
    let j = if rng.random_bool(0.5) {
        (i + 1).min(values.len() - 1)
    } else {
        i.saturating_sub(1)
    };
    values[j]
}

impl Backend for GpuBackend<'_> {
    type MicroKernel = GpuMicroKernel;
    type Target = GpuTarget;

    fn target(&self) -> &GpuTarget {
        &self.target
    }

    fn default_kernel(&self) -> GpuMicroKernel {
        GpuMicroKernel {
            bm: 64,
            bn: 64,
            bk: 8,
            tm: 4,
            tn: 4,
        }
    }

    fn restrict_to_factors(&mut self, factors: Factors) {
        self.factors = Some(factors);
    }

    /// Uniform over the tile sets, rejecting what the target cannot run (the default
    /// micro-kernel if nothing valid turns up).
    fn sample(&self, rng: &mut impl Rng) -> GpuMicroKernel {
        for _ in 0..10_000 {
            let mk = GpuMicroKernel {
                bm: pick(&BLOCK, rng),
                bn: pick(&BLOCK, rng),
                bk: pick(&REDUCTION, rng),
                tm: pick(&THREAD, rng),
                tn: pick(&THREAD, rng),
            };
            if self.contains(&mk) {
                return mk;
            }
        }
        self.default_kernel()
    }

    fn mutate(&self, mk: &GpuMicroKernel, rng: &mut impl Rng) -> GpuMicroKernel {
        for _ in 0..64 {
            let mut m = *mk;
            match rng.random_range(0..5) {
                0 => m.bm = step(&BLOCK, m.bm, rng),
                1 => m.bn = step(&BLOCK, m.bn, rng),
                2 => m.bk = step(&REDUCTION, m.bk, rng),
                3 => m.tm = step(&THREAD, m.tm, rng),
                _ => m.tn = step(&THREAD, m.tn, rng),
            }
            if m != *mk && self.contains(&m) {
                return m;
            }
        }
        self.sample(rng)
    }

    fn crossover(
        &self,
        a: &GpuMicroKernel,
        b: &GpuMicroKernel,
        rng: &mut impl Rng,
    ) -> GpuMicroKernel {
        let mut either = |x: u32, y: u32| if rng.random_bool(0.5) { x } else { y };
        let child = GpuMicroKernel {
            bm: either(a.bm, b.bm),
            bn: either(a.bn, b.bn),
            bk: either(a.bk, b.bk),
            tm: either(a.tm, b.tm),
            tn: either(a.tn, b.tn),
        };
        self.valid_or_sample(child, rng)
    }

    /// From the tiles alone (the printer's structure is fixed): tile sizes, threads,
    /// shared memory, registers, resident blocks and warps, arithmetic per shared load,
    /// global loads per multiply-add, fetch work per thread.
    fn features(
        &self,
        _workload: &Workload,
        mk: &GpuMicroKernel,
        _strategy: PaddingStrategy,
        _representative: &Bindings,
    ) -> Vec<f64> {
        let f = |x: u32| f64::from(x);
        let t = &self.target;
        let threads = f(mk.threads());
        let blocks = f(t.blocks_per_sm(mk));
        vec![
            f(mk.bm).ln(),
            f(mk.bn).ln(),
            f(mk.bk).ln(),
            f(mk.tm),
            f(mk.tn),
            threads.ln(),
            f(mk.shared_bytes()) / 1024.0,
            f(mk.registers_per_thread()),
            blocks,
            blocks * threads / f(t.max_threads_per_sm).max(1.0),
            2.0 * f(mk.tm * mk.tn) / f(mk.tm + mk.tn),
            (f(mk.bm) + f(mk.bn)) / (f(mk.bm) * f(mk.bn)),
            f(mk.bk) * (f(mk.bm) + f(mk.bn)) / threads,
        ]
    }

    /// One task per block (batch × M tiles × N tiles); local padding pads every axis to
    /// its block tile.
    fn adaptation(&self, g: &GemmView, mk: &GpuMicroKernel, bound: &BoundWorkload) -> Adaptation {
        let e = |a: usize| bound.extents[a].max(0) as f64;
        let up = |x: f64, m: u32| (x / f64::from(m)).ceil() * f64::from(m);
        let batch: f64 = g.batch.iter().map(|&a| e(a)).product();
        let (m, n, k) = (e(g.m), e(g.n), e(g.k));
        let blocks = batch * (m / f64::from(mk.bm)).ceil() * (n / f64::from(mk.bn)).ceil();
        let padded = up(m, mk.bm) * up(n, mk.bn) * up(k, mk.bk);
        Adaptation {
            tasks: blocks.max(1.0),
            slots: f64::from(self.target.sm_count * self.target.blocks_per_sm(mk)),
            pad: if padded > 0.0 {
                (m * n * k) / padded
            } else {
                1.0
            },
        }
    }

    fn measure(
        &self,
        batch: &TrialBatch<GpuMicroKernel>,
        on_result: &mut dyn FnMut(usize, TrialResult),
    ) -> Result<f64> {
        let t0 = Instant::now();
        let mut programs: BTreeMap<GpuMicroKernel, GpuProgram> = BTreeMap::new();
        for t in batch.trials {
            programs
                .entry(t.micro_kernel)
                .or_insert_with(|| Self::program(batch, t.micro_kernel));
        }
        let list: Vec<GpuProgram> = programs.values().cloned().collect();
        let lib = self.measurer.builder.build_gpu(&self.target, &list)?;
        let build_seconds = t0.elapsed().as_secs_f64();
        run_built(
            self.measurer,
            &lib,
            batch,
            &|mk| (programs[mk].symbol(&self.target), Some(*mk)),
            on_result,
        )?;
        Ok(build_seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyshape_measure::{Builder, MeasureOptions, Runner, WorkerCommand};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn measurer() -> Measurer {
        Measurer {
            builder: Builder::new(std::env::temp_dir()),
            runner: Runner {
                worker: WorkerCommand {
                    program: "false".into(),
                    args: vec![],
                },
                options: MeasureOptions::default(),
            },
        }
    }

    #[test]
    fn the_space_stays_within_the_target() {
        let m = measurer();
        let mut b = GpuBackend::new(&GpuTarget::h100_sxm(), &m);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..300 {
            let a = b.sample(&mut rng);
            let c = b.mutate(&a, &mut rng);
            let d = b.crossover(&a, &c, &mut rng);
            for k in [a, c, d] {
                assert!(k.validate(b.target()).is_ok(), "{k}");
                seen.insert(k);
            }
        }
        assert!(seen.len() > 100, "the space is explored: {}", seen.len());
        let feats = b.features(
            &Workload::parse("dense(M=T,N=8,K=8)").unwrap(),
            &b.default_kernel(),
            PaddingStrategy::LocalPad,
            &Bindings::default(),
        );
        assert!(feats.iter().all(|x| x.is_finite()));
        // Per-shape: only tiles that divide the instance.
        b.restrict_to_factors(Factors {
            m: 96,
            n: 64,
            k: 48,
        });
        for _ in 0..100 {
            let k = b.sample(&mut rng);
            assert!(96 % k.bm == 0 && 64 % k.bn == 0 && 48 % k.bk == 0, "{k}");
        }
    }

    #[test]
    fn waves_and_padding() {
        let m = measurer();
        let b = GpuBackend::new(&GpuTarget::h100_sxm(), &m);
        let w = Workload::parse("batch_matmul_nt(B=192,M=T,N=T,K=64)").unwrap();
        let g = GemmView::of(&w).unwrap();
        let mk = GpuMicroKernel {
            bm: 128,
            bn: 128,
            bk: 8,
            tm: 8,
            tn: 8,
        };
        let bound = w.bind(&Bindings::from_pairs([("T", 60)])).unwrap();
        let a = b.adaptation(&g, &mk, &bound);
        // 192 blocks of 128×128 on 132 SMs × 2 blocks: one partial wave.
        assert_eq!(a.tasks, 192.0);
        assert_eq!(a.slots, 264.0);
        assert!((a.pad - (60.0 * 60.0) / (128.0 * 128.0)).abs() < 1e-12);
    }
}
