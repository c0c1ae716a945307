//! raft-rs logs through `slog`; the rest of shardlog uses `tracing`. This
//! drain forwards each slog record as a tracing event with target `raft`, so
//! raft's elections show up in the same output, filtered the same way
//! (`RUST_LOG=raft=debug`). It spares us slog's default logger (slog-term,
//! slog-envlogger and their dependencies).

use std::fmt::{self, Write as _};

use slog::{Drain, Level, OwnedKVList, Record, KV};

/// A slog logger for one engine, tagged with its machine id.
pub(super) fn raft_logger(machine: u64) -> slog::Logger {
    slog::Logger::root(TracingDrain, slog::o!("machine" => machine))
}

struct TracingDrain;

impl Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), slog::Never> {
        let level = match record.level() {
            Level::Critical | Level::Error => tracing::Level::ERROR,
            Level::Warning => tracing::Level::WARN,
            // raft-rs says "info" for every vote and role change: routine
            // for an operator, who gets one "controller elected" line from
            // the service instead.
            Level::Info => tracing::Level::DEBUG,
            Level::Debug => tracing::Level::DEBUG,
            Level::Trace => tracing::Level::TRACE,
        };
        // The fields are formatted only for a subscriber that wants them:
        // raft-rs logs often, and the simulation runs without one.
        let enabled = match level {
            tracing::Level::ERROR => tracing::enabled!(target: "raft", tracing::Level::ERROR),
            tracing::Level::WARN => tracing::enabled!(target: "raft", tracing::Level::WARN),
            tracing::Level::INFO => tracing::enabled!(target: "raft", tracing::Level::INFO),
            tracing::Level::DEBUG => tracing::enabled!(target: "raft", tracing::Level::DEBUG),
            _ => tracing::enabled!(target: "raft", tracing::Level::TRACE),
        };
        if !enabled {
            return Ok(());
        }
        let mut fields = Fields(String::new());
        // Formatting into a String cannot fail.
        let _ = record.kv().serialize(record, &mut fields);
        let _ = values.serialize(record, &mut fields);
        let message = record.msg();
        let fields = fields.0;
        match level {
            tracing::Level::ERROR => tracing::error!(target: "raft", "{message}{fields}"),
            tracing::Level::WARN => tracing::warn!(target: "raft", "{message}{fields}"),
            tracing::Level::INFO => tracing::info!(target: "raft", "{message}{fields}"),
            tracing::Level::DEBUG => tracing::debug!(target: "raft", "{message}{fields}"),
            _ => tracing::trace!(target: "raft", "{message}{fields}"),
        }
        Ok(())
    }
}

/// slog's key-value pairs as ` key=value` text.
struct Fields(String);

impl slog::Serializer for Fields {
    fn emit_arguments(&mut self, key: slog::Key, value: &fmt::Arguments<'_>) -> slog::Result {
        let _ = write!(self.0, " {key}={value}");
        Ok(())
    }
}
