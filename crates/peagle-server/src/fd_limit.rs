//! The open-file limit bounds how many connections the server can hold. Every connection is a
//! file descriptor, so the soft `RLIMIT_NOFILE` (often 1024) is raised to the hard limit at
//! startup, as nginx and most servers do, and connections beyond what the limit leaves room
//! for shed idle ones instead of failing `accept` for everyone.

/// Descriptors kept for everything but client connections: the runtime's epoll and wakers,
/// blocking threads, model files being read, logs.
const RESERVED: u64 = 64;

/// The fewest connections the server holds however low the limit is.
const MIN_CONNECTIONS: u64 = 16;

/// Raises the soft open-file limit to the hard one; returns the limit now in force.
pub fn raise_open_files_limit() -> std::io::Result<u64> {
    let mut limit = current()?;
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: setrlimit reads a valid rlimit struct.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(limit.rlim_cur)
}

/// How many client connections fit under the current soft limit.
pub fn connection_capacity() -> usize {
    let soft = current().map(|l| l.rlim_cur).unwrap_or(1024);
    soft.saturating_sub(RESERVED)
        .max(MIN_CONNECTIONS)
        .min(usize::MAX as u64) as usize
}

fn current() -> std::io::Result<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } {
        0 => Ok(limit),
        _ => Err(std::io::Error::last_os_error()),
    }
}
