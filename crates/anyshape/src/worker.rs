//! `anyshape worker --queue URL`: a measuring machine of a work queue (Redis streams):
//! it takes the jobs of its own CPU's target that `tune`/`compile --queue URL` put
//! there, builds and measures them, and posts their results; a line per job.
use crate::tune::interrupt_flag;
use crate::{time_limit, worker, Common};
use anyhow::Result;
use anyshape_measure::queue::{serve, ServeEvent, ServeOptions};
use clap::Args;

/// Options of `anyshape worker`.
#[derive(Args)]
pub struct WorkerArgs {
    /// The work queue: a Redis server (6.2 or later), `redis://HOST:PORT`.
    #[arg(long, value_name = "URL")]
    queue: String,
    /// Its name on the queue [default: HOST-PID].
    #[arg(long)]
    name: Option<String>,
    /// Seconds a job may go without its worker's heartbeat (every 2 s) before another
    /// worker takes it over: a worker that died, or lost its network.
    #[arg(long, default_value_t = 30.0, value_parser = time_limit, value_name = "SECONDS")]
    lease: f64,
    #[command(flatten)]
    common: Common,
}

/// Run `anyshape worker` until Ctrl-C (which lets the job at hand finish) or a lost
/// connection.
pub fn run_worker(args: WorkerArgs) -> Result<()> {
    let target = args.common.target()?;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    let options = ServeOptions {
        name: args
            .name
            .clone()
            .unwrap_or_else(|| format!("{host}-{}", std::process::id())),
        target,
        builder: args.common.builder(),
        worker: worker()?,
        lease_seconds: args.lease,
    };
    let stop = interrupt_flag();
    let name = options.name.clone();
    serve(&args.queue, &options, &stop, &mut |event| match event {
        ServeEvent::Ready {
            fingerprint,
            target,
        } => eprintln!(
            "worker {name}: measuring for {target} (jobs of fingerprint {fingerprint}) on {}",
            args.queue
        ),
        ServeEvent::Started {
            entry,
            kernels,
            candidates,
            took_over,
        } => eprintln!(
            "job {entry}: {kernels} kernel(s), {candidates} measurement(s){}",
            if took_over {
                " (taken over from a silent worker)"
            } else {
                ""
            }
        ),
        ServeEvent::Finished {
            entry,
            seconds,
            posted,
        } => eprintln!(
            "job {entry}: done in {seconds:.2} s{}",
            if posted {
                ""
            } else {
                "; another worker had taken it over, its result stands"
            }
        ),
        ServeEvent::Dropped { entry, why } => eprintln!("job {entry}: dropped: {why}"),
    })?;
    eprintln!("worker {name}: stopped");
    Ok(())
}
