//! Connection limits shared by all cores, and the failed-login throttle
//! (SASL). Touched only when a connection opens or closes or a login fails,
//! never on the data path, so a mutex is fine here.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Failed logins from one address are counted in windows this long; past
/// `--sasl-login-failures-max` in one, its logins are refused, unchecked,
/// until the window ends.
pub const LOGIN_FAILURE_WINDOW: Duration = Duration::from_secs(10);
/// Addresses the throttle remembers at most (expired ones go first).
const THROTTLED_ADDRESSES_MAX: usize = 65536;

#[derive(Debug)]
pub struct ConnectionLimits {
    total_max: usize,
    per_ip_max: usize,
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
    /// 0: no throttle.
    login_failures_max: u32,
    /// Per address: failed logins in the window that began at the instant.
    failed_logins: Mutex<HashMap<IpAddr, (u32, Instant)>>,
}

/// Held while a connection is open; releases its slot when dropped.
#[derive(Debug)]
pub struct ConnectionSlot {
    limits: Arc<ConnectionLimits>,
    ip: IpAddr,
}

impl ConnectionLimits {
    pub fn new(total_max: usize, per_ip_max: usize) -> Arc<Self> {
        Arc::new(Self {
            total_max,
            per_ip_max,
            open: Mutex::new((0, HashMap::new())),
            login_failures_max: 0,
            failed_logins: Mutex::new(HashMap::new()),
        })
    }

    /// Throttles logins from an address past `max` failures in a window
    /// (0: never).
    pub fn with_login_failures_max(self: Arc<Self>, max: u32) -> Arc<Self> {
        let mut limits = Arc::try_unwrap(self).expect("configured before it is shared");
        limits.login_failures_max = max;
        Arc::new(limits)
    }

    /// Whether `ip` may try to log in now (not past `LOGIN_FAILURES_MAX`
    /// failures in its current window).
    pub fn login_allowed(&self, ip: IpAddr, now: Instant) -> bool {
        if self.login_failures_max == 0 {
            return true;
        }
        let failed = self.failed_logins.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        failed
            .get(&ip)
            .is_none_or(|(count, since)| *count < self.login_failures_max || now - *since >= LOGIN_FAILURE_WINDOW)
    }

    /// Counts a failed login from `ip`.
    pub fn login_failed(&self, ip: IpAddr, now: Instant) {
        if self.login_failures_max == 0 {
            return;
        }
        let mut failed = self.failed_logins.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if failed.len() >= THROTTLED_ADDRESSES_MAX {
            failed.retain(|_, (_, since)| now - *since < LOGIN_FAILURE_WINDOW);
        }
        let entry = failed.entry(ip).or_insert((0, now));
        if now - entry.1 >= LOGIN_FAILURE_WINDOW {
            *entry = (0, now);
        }
        entry.0 += 1;
    }

    /// A slot for a new connection from `ip`, or why not.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<ConnectionSlot, &'static str> {
        let mut open = self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if open.0 >= self.total_max {
            return Err("connection limit reached");
        }
        let from_ip = open.1.entry(ip).or_insert(0);
        if *from_ip >= self.per_ip_max {
            return Err("per-IP connection limit reached");
        }
        *from_ip += 1;
        open.0 += 1;
        Ok(ConnectionSlot { limits: self.clone(), ip })
    }

    pub fn open_connections(&self) -> usize {
        self.open.lock().map(|open| open.0).unwrap_or(0)
    }
}

impl ConnectionSlot {
    /// See `ConnectionLimits::login_allowed`.
    pub fn login_allowed(&self) -> bool {
        self.limits.login_allowed(self.ip, Instant::now())
    }

    pub fn login_failed(&self) {
        self.limits.login_failed(self.ip, Instant::now())
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut open = self.limits.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        open.0 = open.0.saturating_sub(1);
        if let Some(count) = open.1.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.1.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_refuse_past_the_maximum_and_free_on_drop() {
        let limits = ConnectionLimits::new(3, 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = limits.admit(a).unwrap();
        let _second = limits.admit(a).unwrap();
        assert!(limits.admit(a).is_err(), "per-IP limit");
        let _third = limits.admit(b).unwrap();
        assert!(limits.admit(b).is_err(), "total limit");
        drop(first);
        assert!(limits.admit(b).is_ok());
    }

    #[test]
    fn an_address_past_the_failed_login_limit_waits_out_its_window() {
        const LOGIN_FAILURES_MAX: u32 = 10;
        let limits = ConnectionLimits::new(3, 2).with_login_failures_max(LOGIN_FAILURES_MAX);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let start = Instant::now();
        for _ in 0..LOGIN_FAILURES_MAX {
            assert!(limits.login_allowed(a, start));
            limits.login_failed(a, start);
        }
        assert!(!limits.login_allowed(a, start + Duration::from_secs(1)));
        assert!(limits.login_allowed(b, start), "another address is not throttled");
        let later = start + LOGIN_FAILURE_WINDOW;
        assert!(limits.login_allowed(a, later));
        limits.login_failed(a, later);
        assert!(limits.login_allowed(a, later), "a new window starts from one failure");
        let unlimited = ConnectionLimits::new(3, 2);
        for _ in 0..1000 {
            unlimited.login_failed(a, start);
        }
        assert!(unlimited.login_allowed(a, start), "0: no throttle");
    }
}
