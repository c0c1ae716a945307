//! Connection limits shared by all cores. Touched only when a connection
//! opens or closes, never on the data path, so a mutex is fine here.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

#[derive(Debug)]
pub struct ConnectionLimits {
    total_max: usize,
    per_ip_max: usize,
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// Held while a connection is open; releases its slot when dropped.
#[derive(Debug)]
pub struct ConnectionSlot {
    limits: Arc<ConnectionLimits>,
    ip: IpAddr,
}

impl ConnectionLimits {
    pub fn new(total_max: usize, per_ip_max: usize) -> Arc<Self> {
        Arc::new(Self { total_max, per_ip_max, open: Mutex::new((0, HashMap::new())) })
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
}
