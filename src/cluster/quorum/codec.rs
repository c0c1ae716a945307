//! Raft messages to and from bytes, with prost (see the module header of
//! `quorum` for why not rust-protobuf). The transport frames them; this only
//! turns one message into bytes and back.

use super::{Message, QuorumError};

pub fn encode_message(message: &Message) -> Vec<u8> {
    prost::Message::encode_to_vec(message)
}

/// Decodes bytes from a peer. prost bounds nesting, so a hostile frame gets
/// an error, not a stack overflow.
pub fn decode_message(bytes: &[u8]) -> Result<Message, QuorumError> {
    Ok(<Message as prost::Message>::decode(bytes)?)
}
