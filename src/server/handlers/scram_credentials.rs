//! DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554):
//! the users of `crate::security`, read from this core's metadata image and
//! changed through the controller (records in the metadata log). The client
//! sends a salted password; the StoredKey and ServerKey kept are derived
//! here, so no password reaches the log. Every user named gets one answer,
//! with Kafka's error codes; a user with any bad change gets none of them.
//! Until ACLs exist, any client that may send requests may manage users.

use std::collections::BTreeSet;
use std::rc::Rc;

use super::{respond, response, Outcome};
use crate::cluster::bridge::{self, Answer};
use crate::cluster::control::ScramChange;
use crate::cluster::records::StoredScram;
use crate::protocol::scram_credentials::*;
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::security::scram::{Credential, Hash, ITERATIONS_MAX, ITERATIONS_MIN};
use crate::shard::Shard;

pub async fn describe(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = DescribeUserScramCredentialsRequest::decode(reader, version)?;
    let image = shard.image();
    let stored = &image.cluster.scram;
    let credentials_of = |user: &str| -> Vec<(i8, i32)> {
        stored.iter().filter(|((name, _), _)| name == user).map(|((_, kind), c)| (*kind, c.iterations as i32)).collect()
    };
    let found = |user: String| {
        let credentials = credentials_of(&user);
        DescribedUser { user, error: ErrorCode::None, error_message: None, credentials }
    };
    let results = match body.users.filter(|u| !u.is_empty()) {
        None => {
            let users: BTreeSet<&str> = stored.keys().map(|(name, _)| name.as_str()).collect();
            users.into_iter().map(|u| found(u.to_string())).collect()
        }
        Some(users) => {
            let twice: BTreeSet<&String> =
                users.iter().filter(|u| users.iter().filter(|v| v == u).count() > 1).collect();
            let mut seen = BTreeSet::new();
            let mut results = Vec::new();
            for user in &users {
                if !seen.insert(user) {
                    continue;
                }
                let refused = |error, message: &str| DescribedUser {
                    user: user.clone(),
                    error,
                    error_message: Some(message.into()),
                    credentials: Vec::new(),
                };
                results.push(if twice.contains(user) {
                    refused(ErrorCode::DuplicateResource, "Cannot describe SCRAM credentials for the same user twice")
                } else if credentials_of(user).is_empty() {
                    refused(ErrorCode::ResourceNotFound, "Attempt to describe a user credential that does not exist")
                } else {
                    found(user.clone())
                });
            }
            results
        }
    };
    let mut w = response(request);
    DescribeUserScramCredentialsResponse { throttle_time_ms: 0, error: ErrorCode::None, error_message: None, results }
        .encode(&mut w, version);
    Ok(respond(w))
}

pub async fn alter(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = AlterUserScramCredentialsRequest::decode(reader, version)?;
    let (changes, mut results) = validate(&body);
    let valid: Vec<ScramChange> = changes.into_iter().flatten().collect();
    if !valid.is_empty() {
        let answers = submit(shard, &valid).await;
        for (change, (error, message)) in valid.iter().zip(answers) {
            if let Some(slot) = results.iter_mut().find(|(user, _, _)| *user == change.user) {
                slot.1 = error;
                slot.2 = message;
            }
        }
    }
    let mut w = response(request);
    AlterUserScramCredentialsResponse { throttle_time_ms: 0, results }.encode(&mut w, version);
    Ok(respond(w))
}

type UserResult = (String, ErrorCode, Option<String>);

/// Each user's changes (in the order users first appear), or its refusal.
fn validate(body: &AlterUserScramCredentialsRequest) -> (Vec<Option<ScramChange>>, Vec<UserResult>) {
    let mut users: Vec<&str> = Vec::new();
    for name in body.deletions.iter().map(|(n, _)| n.as_str()).chain(body.upsertions.iter().map(|u| u.name.as_str())) {
        if !users.contains(&name) {
            users.push(name);
        }
    }
    let mut changes = Vec::new();
    let mut results = Vec::new();
    for user in users {
        let mut change = ScramChange { user: user.to_string(), set: Vec::new(), delete: Vec::new() };
        let mut seen = BTreeSet::new();
        let mut refusal: Option<(ErrorCode, &str)> = None;
        let mut refuse = |error, message| {
            refusal.get_or_insert((error, message));
        };
        if user.is_empty() {
            refuse(ErrorCode::UnacceptableCredential, "Username must not be empty");
        }
        for (_, kind) in body.deletions.iter().filter(|(n, _)| n == user) {
            if Hash::from_kafka_type(*kind).is_none() {
                refuse(ErrorCode::UnsupportedSaslMechanism, "Unknown SCRAM mechanism");
            } else if !seen.insert(*kind) {
                refuse(ErrorCode::DuplicateResource, "A user credential cannot be altered twice in the same request");
            }
            change.delete.push(*kind);
        }
        for upsertion in body.upsertions.iter().filter(|u| u.name == user) {
            let Some(hash) = Hash::from_kafka_type(upsertion.mechanism) else {
                refuse(ErrorCode::UnsupportedSaslMechanism, "Unknown SCRAM mechanism");
                continue;
            };
            if !seen.insert(upsertion.mechanism) {
                refuse(ErrorCode::DuplicateResource, "A user credential cannot be altered twice in the same request");
            }
            if upsertion.iterations < ITERATIONS_MIN as i32 {
                refuse(ErrorCode::UnacceptableCredential, "Too few iterations");
            } else if upsertion.iterations > ITERATIONS_MAX as i32 {
                refuse(ErrorCode::UnacceptableCredential, "Too many iterations");
            }
            if upsertion.salt.is_empty() || upsertion.salted_password.is_empty() {
                refuse(ErrorCode::UnacceptableCredential, "The salt and the salted password must not be empty");
            }
            let iterations = upsertion.iterations.max(0) as u32;
            let credential =
                Credential::from_salted_password(hash, &upsertion.salted_password, &upsertion.salt, iterations);
            change.set.push((upsertion.mechanism, StoredScram::from(credential)));
        }
        match refusal {
            Some((error, message)) => {
                results.push((user.to_string(), error, Some(message.to_string())));
                changes.push(None);
            }
            None => {
                results.push((user.to_string(), ErrorCode::None, None));
                changes.push(Some(change));
            }
        }
    }
    (changes, results)
}

/// The controller's answer for each change, in order.
async fn submit(shard: &Rc<Shard>, changes: &[ScramChange]) -> Vec<(ErrorCode, Option<String>)> {
    let failed = |error: ErrorCode, message: String| vec![(error, Some(message)); changes.len()];
    let Some((handle, _)) = shard.controller() else {
        return failed(ErrorCode::NotController, "no controller service".into());
    };
    let request = bridge::Request::AlterScram { changes: changes.to_vec(), only_if_absent: false };
    match bridge::request(handle, &request).await {
        Ok(Answer::Items(items)) => {
            items.into_iter().map(|(_, code, message)| (crate::protocol::error::from_code(code), message)).collect()
        }
        Ok(Answer::Refused(code, reason)) => failed(crate::protocol::error::from_code(code), reason),
        Ok(other) => failed(ErrorCode::UnknownServerError, format!("unexpected answer {other:?}")),
        Err(err) => {
            let names: Vec<String> = changes.iter().map(|c| c.user.clone()).collect();
            let error = bridge::failed_items(&names, &err)[0].error;
            failed(error, err.to_string())
        }
    }
}
