//! Kafka error codes: the one place where they are spelled out. Handlers map
//! their own error enums onto these.

/// A Kafka protocol error code (the `error_code` field of responses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i16)]
#[non_exhaustive]
pub enum ErrorCode {
    UnknownServerError = -1,
    None = 0,
    OffsetOutOfRange = 1,
    CorruptMessage = 2,
    UnknownTopicOrPartition = 3,
    InvalidFetchSize = 4,
    LeaderNotAvailable = 5,
    NotLeaderOrFollower = 6,
    RequestTimedOut = 7,
    ReplicaNotAvailable = 9,
    MessageTooLarge = 10,
    OffsetMetadataTooLarge = 12,
    CoordinatorLoadInProgress = 14,
    CoordinatorNotAvailable = 15,
    NotCoordinator = 16,
    InvalidTopicException = 17,
    RecordListTooLarge = 18,
    NotEnoughReplicas = 19,
    InvalidRequiredAcks = 21,
    IllegalGeneration = 22,
    InconsistentGroupProtocol = 23,
    InvalidGroupId = 24,
    UnknownMemberId = 25,
    InvalidSessionTimeout = 26,
    RebalanceInProgress = 27,
    InvalidCommitOffsetSize = 28,
    InvalidTimestamp = 32,
    UnsupportedVersion = 35,
    TopicAlreadyExists = 36,
    InvalidPartitions = 37,
    InvalidReplicationFactor = 38,
    InvalidReplicaAssignment = 39,
    InvalidConfig = 40,
    NotController = 41,
    InvalidRequest = 42,
    PolicyViolation = 44,
    OutOfOrderSequenceNumber = 45,
    DuplicateSequenceNumber = 46,
    InvalidProducerEpoch = 47,
    InvalidProducerIdMapping = 49,
    TransactionalIdAuthorizationFailed = 53,
    KafkaStorageError = 56,
    LogDirNotFound = 57,
    UnknownProducerId = 59,
    NonEmptyGroup = 68,
    GroupIdNotFound = 69,
    FetchSessionIdNotFound = 70,
    InvalidFetchSessionEpoch = 71,
    FencedLeaderEpoch = 74,
    UnknownLeaderEpoch = 75,
    MemberIdRequired = 79,
    GroupMaxSizeReached = 81,
    FencedInstanceId = 82,
    InvalidRecord = 87,
    UnstableOffsetCommit = 88,
    BrokerIdNotRegistered = 102,
    MismatchedEndpointType = 114,
}

impl ErrorCode {
    pub fn code(self) -> i16 {
        self as i16
    }

    pub fn is_ok(self) -> bool {
        self == ErrorCode::None
    }
}

/// Maps a received error code onto the enum (client side); codes we do not
/// know read as UNKNOWN_SERVER_ERROR.
pub fn from_code(code: i16) -> ErrorCode {
    use ErrorCode::*;
    const ALL: &[ErrorCode] = &[
        UnknownServerError,
        None,
        OffsetOutOfRange,
        CorruptMessage,
        UnknownTopicOrPartition,
        InvalidFetchSize,
        LeaderNotAvailable,
        NotLeaderOrFollower,
        RequestTimedOut,
        ReplicaNotAvailable,
        MessageTooLarge,
        OffsetMetadataTooLarge,
        CoordinatorLoadInProgress,
        CoordinatorNotAvailable,
        NotCoordinator,
        InvalidTopicException,
        RecordListTooLarge,
        NotEnoughReplicas,
        InvalidRequiredAcks,
        IllegalGeneration,
        InconsistentGroupProtocol,
        InvalidGroupId,
        UnknownMemberId,
        InvalidSessionTimeout,
        RebalanceInProgress,
        InvalidCommitOffsetSize,
        InvalidTimestamp,
        UnsupportedVersion,
        TopicAlreadyExists,
        InvalidPartitions,
        InvalidReplicationFactor,
        InvalidReplicaAssignment,
        InvalidConfig,
        NotController,
        InvalidRequest,
        PolicyViolation,
        OutOfOrderSequenceNumber,
        DuplicateSequenceNumber,
        InvalidProducerEpoch,
        InvalidProducerIdMapping,
        TransactionalIdAuthorizationFailed,
        KafkaStorageError,
        LogDirNotFound,
        UnknownProducerId,
        NonEmptyGroup,
        GroupIdNotFound,
        FetchSessionIdNotFound,
        InvalidFetchSessionEpoch,
        FencedLeaderEpoch,
        UnknownLeaderEpoch,
        MemberIdRequired,
        GroupMaxSizeReached,
        FencedInstanceId,
        InvalidRecord,
        UnstableOffsetCommit,
        BrokerIdNotRegistered,
        MismatchedEndpointType,
    ];
    ALL.iter().copied().find(|e| e.code() == code).unwrap_or(UnknownServerError)
}
