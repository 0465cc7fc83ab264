//! The file-descriptor budget: how many client connections the process can
//! hold open and still keep a reserve of descriptors for what must keep
//! working under a flood (the config watcher, the Kubernetes client, the
//! metrics listener, the log). Read once at start from RLIMIT_NOFILE.

use super::args::GatewayError;

/// Admin connections (`/metrics`, `/healthz`, `/readyz`): a scraper and the
/// kubelet's probes need a few, never hundreds.
const ADMIN_CONNECTIONS: usize = 16;

/// Fewer client connections than this is a limit set by mistake.
const MIN_CONNECTIONS: usize = 8;

/// The figures the connection limits come from (logged at start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FdBudget {
    /// RLIMIT_NOFILE's soft limit, after raising it to the hard limit.
    pub(super) limit: u64,
    /// Descriptors already open at start.
    pub(super) open: u64,
    /// Kept free whatever the clients do.
    pub(super) reserve: u64,
    /// Client connections on the request listener.
    pub(super) proxy: usize,
    /// Connections on the admin listener.
    pub(super) admin: usize,
}

/// The connection limits for a descriptor limit: after what is open and the
/// reserve, the admin listener's few, then half of the rest, since each
/// client connection may hold one upstream connection too. `asked`
/// (`--max-connections`) can only lower the client figure.
pub(super) fn budget(
    limit: u64,
    open: u64,
    reserve: u64,
    asked: Option<usize>,
) -> Result<FdBudget, GatewayError> {
    let free = limit.saturating_sub(open).saturating_sub(reserve);
    let free = usize::try_from(free).unwrap_or(usize::MAX);
    let admin = ADMIN_CONNECTIONS.min(free / 4);
    let derived = free.saturating_sub(admin) / 2;
    let proxy = asked.map_or(derived, |a| a.min(derived));
    if proxy < MIN_CONNECTIONS || admin == 0 {
        return Err(GatewayError::FdLimit(format!(
            "RLIMIT_NOFILE {limit} with {open} open and a reserve of {reserve} \
             leaves {proxy} client connections (at least {MIN_CONNECTIONS}); raise the \
             limit or lower --fd-reserve / raise --max-connections"
        )));
    }
    Ok(FdBudget {
        limit,
        open,
        reserve,
        proxy,
        admin,
    })
}

/// Raises the soft RLIMIT_NOFILE to the hard limit (as the Go runtime does)
/// and counts the descriptors open now; then [`budget`].
pub(super) fn read(reserve: u64, asked: Option<usize>) -> Result<FdBudget, GatewayError> {
    let limit = match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(l) => l,
        Err(e) => {
            let (soft, _) = rlimit::getrlimit(rlimit::Resource::NOFILE)
                .map_err(|e2| GatewayError::FdLimit(format!("reading RLIMIT_NOFILE: {e}; {e2}")))?;
            soft
        }
    };
    // One entry is the directory's own descriptor while it is read.
    let open = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count().saturating_sub(1) as u64)
        .unwrap_or(16);
    budget(limit, open, reserve, asked)
}

/// Whether an accept error means the process (or system) is out of
/// descriptors or memory: back off instead of retrying at once.
pub(super) fn is_exhaustion(e: &std::io::Error) -> bool {
    // EMFILE 24, ENFILE 23, ENOBUFS 105, ENOMEM 12 on Linux.
    matches!(e.raw_os_error(), Some(24 | 23 | 105 | 12))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_and_the_upstream_side_come_off_the_limit() {
        // 256 - 16 open - 64 reserve = 176: 16 admin, (176 - 16) / 2 = 80.
        let b = budget(256, 16, 64, None).unwrap();
        assert_eq!((b.proxy, b.admin), (80, 16));
        // Every client connection, with its upstream one and the admin
        // listener full, still leaves the reserve free.
        assert!(b.open + 2 * b.proxy as u64 + b.admin as u64 + b.reserve <= b.limit);
        assert_eq!(budget(256, 16, 64, Some(10)).unwrap().proxy, 10);
        assert_eq!(budget(256, 16, 64, Some(1000)).unwrap().proxy, 80);
        assert_eq!(budget(1 << 20, 20, 64, None).unwrap().proxy, 524_238);
    }

    #[test]
    fn a_limit_that_leaves_too_few_connections_is_an_error() {
        for (limit, open, reserve, asked) in [
            (64, 10, 64, None),
            (90, 10, 64, None),
            (4096, 10, 64, Some(2)),
        ] {
            let e = budget(limit, open, reserve, asked).unwrap_err();
            assert!(e.to_string().contains("RLIMIT_NOFILE"), "{e}");
        }
    }

    #[test]
    fn descriptor_exhaustion_is_recognised() {
        assert!(is_exhaustion(&std::io::Error::from_raw_os_error(24)));
        assert!(is_exhaustion(&std::io::Error::from_raw_os_error(23)));
        assert!(!is_exhaustion(&std::io::Error::from_raw_os_error(103)));
    }
}
