//! Whether an allocation can fit: checked from the sizes before allocating, so that a
//! huge shape is a clear error instead of an allocation abort or the out-of-memory
//! killer — when tuning, measuring and running alike.

/// This machine's memory in bytes from `/proc/meminfo`: (available now, in all).
pub fn memory() -> Option<(u128, u128)> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u128> {
        let kb: u128 = info
            .lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        Some(kb * 1024)
    };
    let total = field("MemTotal:")?;
    Some((field("MemAvailable:").unwrap_or(total), total))
}

/// Bytes as GiB, for messages.
pub fn gib(bytes: u128) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// Refuse `bytes` of buffers for `what` (e.g. "the instance's buffers") where they
/// cannot fit: more than the machine has available, or more than the allocator grants
/// (asked without touching a page). The message says how much is needed and what the
/// machine has.
pub fn check_fits(bytes: u128, what: &str) -> Result<(), String> {
    let refuse = |has: String| Err(format!("{what} need {:.2} GiB, {has}", gib(bytes)));
    if let Some((available, total)) = memory() {
        if bytes > available {
            return refuse(format!(
                "the machine has {:.2} GiB available ({:.2} GiB in all)",
                gib(available),
                gib(total)
            ));
        }
    }
    let mut probe: Vec<u8> = Vec::new();
    if usize::try_from(bytes).map_or(true, |b| probe.try_reserve_exact(b).is_err()) {
        return refuse("more than the allocator grants".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_cannot_fit_is_refused_with_the_figures() {
        assert!(check_fits(1 << 20, "a test's buffers").is_ok());
        let e = check_fits(1 << 60, "a test's buffers").unwrap_err();
        assert!(
            e.starts_with("a test's buffers need") && e.contains("GiB"),
            "{e}"
        );
        assert!(check_fits(u128::MAX, "x").is_err());
    }
}
