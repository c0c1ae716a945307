//! Every limit and timeout of the group coordinator, with Kafka's defaults
//! where Kafka has one (the broker setting is named on each field).

/// Kafka's `group.initial.rebalance.delay.ms` default.
pub const INITIAL_REBALANCE_DELAY_MS_DEFAULT: u64 = 3_000;
/// Kafka's `group.min.session.timeout.ms` default.
pub const SESSION_TIMEOUT_MS_MIN_DEFAULT: i32 = 6_000;
/// Kafka's `group.max.session.timeout.ms` default.
pub const SESSION_TIMEOUT_MS_MAX_DEFAULT: i32 = 1_800_000;
/// Kafka's (fixed) NewMemberJoinTimeoutMs.
pub const NEW_MEMBER_JOIN_TIMEOUT_MS_DEFAULT: u64 = 300_000;
/// Kafka's `offset.metadata.max.bytes` default.
pub const OFFSET_METADATA_BYTES_MAX_DEFAULT: usize = 4_096;
/// Kafka's `group.max.size` is unbounded; ours is not.
pub const MEMBERS_PER_GROUP_MAX_DEFAULT: usize = 1_000;
pub const PROTOCOLS_PER_MEMBER_MAX_DEFAULT: usize = 64;
pub const MEMBER_METADATA_BYTES_MAX_DEFAULT: usize = 1024 * 1024;
pub const ASSIGNMENT_BYTES_MAX_DEFAULT: usize = 1024 * 1024;
pub const GROUPS_MAX_DEFAULT: usize = 100_000;

/// Strings in offset records carry an i16 length, like Kafka's.
pub const RECORD_STRING_BYTES_MAX: usize = i16::MAX as usize;

const _: () = assert!(SESSION_TIMEOUT_MS_MIN_DEFAULT <= SESSION_TIMEOUT_MS_MAX_DEFAULT);
const _: () = assert!(OFFSET_METADATA_BYTES_MAX_DEFAULT <= RECORD_STRING_BYTES_MAX);
const _: () = assert!(NEW_MEMBER_JOIN_TIMEOUT_MS_DEFAULT > INITIAL_REBALANCE_DELAY_MS_DEFAULT);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupConfig {
    /// `group.initial.rebalance.delay.ms`: how long the first rebalance of
    /// an Empty group waits for more members, extended (up to the rebalance
    /// timeout) while new members keep arriving.
    pub initial_rebalance_delay_ms: u64,
    /// `group.min.session.timeout.ms`.
    pub session_timeout_ms_min: i32,
    /// `group.max.session.timeout.ms`.
    pub session_timeout_ms_max: i32,
    /// How long a brand-new member's JoinGroup may wait in a rebalance
    /// before the member is dropped (it cannot heartbeat without an id).
    pub new_member_join_timeout_ms: u64,
    /// `group.max.size`: members (joined or waiting for an id) per group.
    pub members_per_group_max: usize,
    /// Protocols (assignors) one member may offer.
    pub protocols_per_member_max: usize,
    /// Total protocol metadata bytes one member may offer.
    pub member_metadata_bytes_max: usize,
    /// Bytes of one member's assignment in the leader's SyncGroup.
    pub assignment_bytes_max: usize,
    /// `offset.metadata.max.bytes`: longer commit metadata is refused with
    /// OFFSET_METADATA_TOO_LARGE.
    pub offset_metadata_bytes_max: usize,
    /// Groups one coordinator holds, Empty ones with offsets included.
    pub groups_max: usize,
    /// Mixed into generated member ids so that ids handed out by different
    /// coordinators or broker runs never collide (the broker passes node id
    /// and start time, say). No randomness inside the state machine.
    pub member_id_seed: u64,
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            initial_rebalance_delay_ms: INITIAL_REBALANCE_DELAY_MS_DEFAULT,
            session_timeout_ms_min: SESSION_TIMEOUT_MS_MIN_DEFAULT,
            session_timeout_ms_max: SESSION_TIMEOUT_MS_MAX_DEFAULT,
            new_member_join_timeout_ms: NEW_MEMBER_JOIN_TIMEOUT_MS_DEFAULT,
            members_per_group_max: MEMBERS_PER_GROUP_MAX_DEFAULT,
            protocols_per_member_max: PROTOCOLS_PER_MEMBER_MAX_DEFAULT,
            member_metadata_bytes_max: MEMBER_METADATA_BYTES_MAX_DEFAULT,
            assignment_bytes_max: ASSIGNMENT_BYTES_MAX_DEFAULT,
            offset_metadata_bytes_max: OFFSET_METADATA_BYTES_MAX_DEFAULT,
            groups_max: GROUPS_MAX_DEFAULT,
            member_id_seed: 0,
        }
    }
}

/// A configuration the coordinator cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GroupConfigError {
    #[error("session timeout bounds are inverted: min {min_ms} ms > max {max_ms} ms")]
    SessionTimeoutBounds { min_ms: i32, max_ms: i32 },
    #[error("offset metadata limit {0} bytes exceeds what an offset record can hold")]
    OffsetMetadataTooLarge(usize),
    #[error("{0} must be at least 1")]
    Zero(&'static str),
}

impl GroupConfig {
    /// Checks the settings once, when the broker starts.
    pub fn validate(&self) -> Result<(), GroupConfigError> {
        if self.session_timeout_ms_min > self.session_timeout_ms_max {
            return Err(GroupConfigError::SessionTimeoutBounds {
                min_ms: self.session_timeout_ms_min,
                max_ms: self.session_timeout_ms_max,
            });
        }
        if self.offset_metadata_bytes_max > RECORD_STRING_BYTES_MAX {
            return Err(GroupConfigError::OffsetMetadataTooLarge(self.offset_metadata_bytes_max));
        }
        if self.members_per_group_max == 0 {
            return Err(GroupConfigError::Zero("members_per_group_max"));
        }
        if self.protocols_per_member_max == 0 {
            return Err(GroupConfigError::Zero("protocols_per_member_max"));
        }
        if self.groups_max == 0 {
            return Err(GroupConfigError::Zero("groups_max"));
        }
        Ok(())
    }
}
