//! Authentication (issue 32): SASL on the Kafka listeners, with PLAIN,
//! SCRAM-SHA-256 and SCRAM-SHA-512 (`--sasl-mechanisms`).
//!
//! Users live in the cluster's metadata log as SCRAM credentials (salted,
//! hashed: `scram::Credential`), so every machine and core checks them
//! against its own metadata image with no cross-core hop. PLAIN checks its
//! password against the same stored credential (as Redpanda does), so one
//! user store serves all three mechanisms. `--bootstrap-user` creates the
//! first user of a new cluster.
//!
//! A connection on a SASL listener goes through Kafka's states: it may send
//! ApiVersions, then SaslHandshake (choosing a mechanism), then the
//! mechanism's tokens in SaslAuthenticate requests (or, after a v0
//! handshake, as bare size-prefixed tokens, Kafka's pre-KIP-152 framing).
//! Anything else before it is authenticated closes it, as does a failed
//! authentication (after the error answer). `Authenticator` is that state
//! machine, with no I/O; `server::connection` feeds it frames.

pub mod scram;

use scram::{Credential, Hash, Progress, ScramError, ScramServer};

/// A SASL mechanism shardlog serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mechanism {
    Plain,
    Scram(Hash),
}

impl Mechanism {
    pub const ALL: [Mechanism; 3] = [Mechanism::Plain, Mechanism::Scram(Hash::Sha256), Mechanism::Scram(Hash::Sha512)];

    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::Scram(hash) => hash.mechanism(),
        }
    }

    /// Kafka's mechanism names are case-sensitive; so is this.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// Parses `--sasl-mechanisms` (a comma-separated list; empty: no SASL).
pub fn parse_mechanisms(list: &str) -> Result<Vec<Mechanism>, String> {
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let mechanism = Mechanism::from_name(name).ok_or_else(|| {
            let known: Vec<&str> = Mechanism::ALL.iter().map(|m| m.name()).collect();
            format!("unknown SASL mechanism {name:?} (known: {})", known.join(", "))
        })?;
        if !out.contains(&mechanism) {
            out.push(mechanism);
        }
    }
    Ok(out)
}

/// Parses `NAME:PASSWORD` (`--bootstrap-user`, the client commands' user).
pub fn parse_user(text: &str) -> Result<(String, String), String> {
    match text.split_once(':') {
        Some((name, password)) if !name.is_empty() && !password.is_empty() => {
            Ok((name.to_string(), password.to_string()))
        }
        _ => Err("must be NAME:PASSWORD, both non-empty".into()),
    }
}

/// A SASL mechanism and the user a client logs in as (shardlog's own
/// clients: followers, client commands).
#[derive(Debug, Clone)]
pub struct SaslLogin {
    pub mechanism: Mechanism,
    pub user: String,
    pub password: String,
}

impl SaslLogin {
    /// The client's side of one login: `first`, then `next` with each answer.
    pub fn exchange(&self) -> LoginExchange {
        let scram = match self.mechanism {
            Mechanism::Scram(hash) => Some(scram::ScramClient::new(hash, &self.user, &self.password)),
            Mechanism::Plain => None,
        };
        LoginExchange { login: self.clone(), scram, answered: 0 }
    }
}

/// The tokens a client sends, one answer at a time.
pub struct LoginExchange {
    login: SaslLogin,
    scram: Option<scram::ScramClient>,
    answered: u8,
}

impl LoginExchange {
    pub fn first(&self) -> Vec<u8> {
        match &self.scram {
            Some(client) => client.first(),
            None => format!("\0{}\0{}", self.login.user, self.login.password).into_bytes(),
        }
    }

    /// The next token for the server's `answer`; `None` when the login is
    /// complete (and, for SCRAM, the server proved it knows the password).
    pub fn next(&mut self, answer: &[u8]) -> Result<Option<Vec<u8>>, ScramError> {
        self.answered += 1;
        match (&mut self.scram, self.answered) {
            (None, _) => Ok(None),
            (Some(client), 1) => client.answer(answer).map(Some),
            (Some(client), _) => client.verify(answer).map(|()| None),
        }
    }
}

/// Where the authenticator finds a user's stored credential for a hash.
pub trait Credentials {
    fn scram(&self, user: &str, hash: Hash) -> Option<Credential>;
}

/// Why a connection is refused, with Kafka's error code for the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: crate::protocol::ErrorCode,
    pub message: String,
}

impl Refusal {
    fn failed(message: impl Into<String>) -> Self {
        Refusal { code: crate::protocol::ErrorCode::SaslAuthenticationFailed, message: message.into() }
    }

    fn illegal(message: impl Into<String>) -> Self {
        Refusal { code: crate::protocol::ErrorCode::IllegalSaslState, message: message.into() }
    }
}

/// The answer to one token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send this token back; another comes.
    Continue(Vec<u8>),
    /// Authenticated as `user`; send `token` back (possibly empty).
    Done { user: String, token: Vec<u8> },
}

enum State {
    AwaitingHandshake,
    AwaitingToken { mechanism: Mechanism, scram: Option<ScramServer> },
    Authenticated(String),
    Failed,
}

/// One connection's SASL state.
pub struct Authenticator {
    enabled: Vec<Mechanism>,
    state: State,
    /// The handshake was v0: tokens come bare, not in SaslAuthenticate.
    bare_tokens: bool,
}

impl Authenticator {
    pub fn new(enabled: Vec<Mechanism>) -> Self {
        Authenticator { enabled, state: State::AwaitingHandshake, bare_tokens: false }
    }

    pub fn enabled(&self) -> &[Mechanism] {
        &self.enabled
    }

    /// The authenticated user, once there is one.
    pub fn user(&self) -> Option<&str> {
        match &self.state {
            State::Authenticated(user) => Some(user),
            _ => None,
        }
    }

    /// Whether the next frame is a bare token (after a v0 handshake).
    pub fn expects_bare_token(&self) -> bool {
        self.bare_tokens && matches!(self.state, State::AwaitingToken { .. })
    }

    /// SaslHandshake: chooses the mechanism. Refused (and the connection
    /// then closed) with UNSUPPORTED_SASL_MECHANISM for one not enabled, or
    /// ILLEGAL_SASL_STATE out of turn.
    pub fn handshake(&mut self, name: &str, version: i16) -> Result<Mechanism, Refusal> {
        if !matches!(self.state, State::AwaitingHandshake) {
            self.state = State::Failed;
            return Err(Refusal::illegal("SaslHandshake out of turn: the handshake is done"));
        }
        let Some(mechanism) = Mechanism::from_name(name).filter(|m| self.enabled.contains(m)) else {
            self.state = State::Failed;
            return Err(Refusal {
                code: crate::protocol::ErrorCode::UnsupportedSaslMechanism,
                message: format!("SASL mechanism {name:?} is not enabled"),
            });
        };
        let scram = match mechanism {
            Mechanism::Scram(hash) => Some(ScramServer::new(hash)),
            Mechanism::Plain => None,
        };
        self.state = State::AwaitingToken { mechanism, scram };
        self.bare_tokens = version == 0;
        Ok(mechanism)
    }

    /// One client token (SaslAuthenticate's bytes, or a bare token).
    pub fn authenticate(&mut self, token: &[u8], credentials: &dyn Credentials) -> Result<Step, Refusal> {
        let state = std::mem::replace(&mut self.state, State::Failed);
        let State::AwaitingToken { mechanism, scram } = state else {
            return Err(Refusal::illegal("SaslAuthenticate before SaslHandshake or after authentication"));
        };
        match (mechanism, scram) {
            (Mechanism::Plain, _) => {
                let user = check_plain(token, credentials)?;
                self.state = State::Authenticated(user.clone());
                Ok(Step::Done { user, token: Vec::new() })
            }
            (Mechanism::Scram(hash), Some(mut server)) => {
                let lookup = |user: &str| credentials.scram(user, hash);
                match server.step(token, &lookup) {
                    Ok(Progress::Challenge(challenge)) => {
                        self.state = State::AwaitingToken { mechanism, scram: Some(server) };
                        Ok(Step::Continue(challenge))
                    }
                    Ok(Progress::Authenticated { user, server_final }) => {
                        self.state = State::Authenticated(user.clone());
                        Ok(Step::Done { user, token: server_final })
                    }
                    Err(err @ ScramError::BadCredentials) => Err(Refusal::failed(format!(
                        "Authentication failed during authentication due to invalid credentials with SASL mechanism {}: {err}",
                        hash.mechanism()
                    ))),
                    Err(err) => Err(Refusal::failed(format!("{}: {err}", hash.mechanism()))),
                }
            }
            (Mechanism::Scram(_), None) => unreachable!("a SCRAM handshake always makes its server"),
        }
    }
}

/// RFC 4616: `[authzid] NUL authcid NUL passwd`, checked against the user's
/// stored SCRAM credential (SHA-512 first, then SHA-256).
fn check_plain(token: &[u8], credentials: &dyn Credentials) -> Result<String, Refusal> {
    if token.len() > scram::MESSAGE_BYTES_MAX {
        return Err(Refusal::failed("PLAIN: the token is too long"));
    }
    let text = std::str::from_utf8(token).map_err(|_| Refusal::failed("PLAIN: the token is not UTF-8"))?;
    let mut parts = text.split('\0');
    let (Some(authzid), Some(user), Some(password), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refusal::failed("PLAIN: the token is not authzid NUL user NUL password"));
    };
    if user.is_empty() || password.is_empty() {
        return Err(Refusal::failed("PLAIN: the user name and password must not be empty"));
    }
    if !authzid.is_empty() && authzid != user {
        return Err(Refusal::failed("PLAIN: an authorization id other than the user is not supported"));
    }
    let matches = [Hash::Sha512, Hash::Sha256]
        .into_iter()
        .find_map(|hash| credentials.scram(user, hash).map(|c| c.matches_password(hash, password)));
    match matches {
        Some(true) => Ok(user.to_string()),
        _ => Err(Refusal::failed(
            "Authentication failed during authentication due to invalid credentials with SASL mechanism PLAIN",
        )),
    }
}

/// The metadata image's credentials.
impl Credentials for crate::cluster::image::ClusterImage {
    fn scram(&self, user: &str, hash: Hash) -> Option<Credential> {
        self.scram.get(&(user.to_string(), hash.kafka_type())).map(Credential::from)
    }
}

#[cfg(test)]
mod tests {
    use super::scram::{ScramClient, ITERATIONS_MIN};
    use super::*;
    use crate::protocol::ErrorCode;

    struct Users(Vec<(String, Hash, Credential)>);

    impl Credentials for Users {
        fn scram(&self, user: &str, hash: Hash) -> Option<Credential> {
            self.0.iter().find(|(u, h, _)| u == user && *h == hash).map(|(_, _, c)| c.clone())
        }
    }

    fn alice() -> Users {
        Users(vec![
            ("alice".into(), Hash::Sha256, Credential::new(Hash::Sha256, "pw", ITERATIONS_MIN)),
            ("alice".into(), Hash::Sha512, Credential::new(Hash::Sha512, "pw", ITERATIONS_MIN)),
        ])
    }

    #[test]
    fn the_mechanism_list_parses_and_refuses_unknown_names() {
        assert_eq!(
            parse_mechanisms("SCRAM-SHA-512, PLAIN,PLAIN").unwrap(),
            vec![Mechanism::Scram(Hash::Sha512), Mechanism::Plain]
        );
        assert_eq!(parse_mechanisms("").unwrap(), vec![]);
        assert!(parse_mechanisms("GSSAPI").unwrap_err().contains("GSSAPI"));
        assert!(parse_user("alice").is_err());
        assert!(parse_user(":pw").is_err());
        assert_eq!(parse_user("alice:p:w").unwrap(), ("alice".into(), "p:w".into()));
    }

    #[test]
    fn plain_authenticates_with_the_right_password_only() {
        let users = alice();
        let mut auth = Authenticator::new(vec![Mechanism::Plain]);
        auth.handshake("PLAIN", 1).unwrap();
        assert_eq!(auth.authenticate(b"\0alice\0pw", &users), Ok(Step::Done { user: "alice".into(), token: vec![] }));
        assert_eq!(auth.user(), Some("alice"));
        for bad in [&b"\0alice\0nope"[..], b"\0bob\0pw", b"alice\0pw", b"bob\0alice\0pw", b"\0alice\0pw\0x"] {
            let mut auth = Authenticator::new(vec![Mechanism::Plain]);
            auth.handshake("PLAIN", 1).unwrap();
            let refusal = auth.authenticate(bad, &users).unwrap_err();
            assert_eq!(refusal.code, ErrorCode::SaslAuthenticationFailed, "{bad:?}");
            assert_eq!(auth.user(), None);
        }
    }

    #[test]
    fn scram_runs_two_rounds_then_authenticates() {
        let users = alice();
        let mut auth = Authenticator::new(vec![Mechanism::Scram(Hash::Sha256)]);
        auth.handshake("SCRAM-SHA-256", 1).unwrap();
        let mut client = ScramClient::new(Hash::Sha256, "alice", "pw");
        let Ok(Step::Continue(first)) = auth.authenticate(&client.first(), &users) else { panic!() };
        assert_eq!(auth.user(), None);
        let last = client.answer(&first).unwrap();
        let Ok(Step::Done { user, token }) = auth.authenticate(&last, &users) else { panic!() };
        assert_eq!(user, "alice");
        client.verify(&token).unwrap();
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Fuzzing the exchanges: any bytes, or SCRAM's grammar with random
        /// pieces, get an answer or a refusal, never a panic, and never a
        /// login without the password.
        #[test]
        fn any_tokens_are_answered_or_refused_never_a_panic(
            first in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            last in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            user in "[a-z=,]{0,8}",
            nonce in "[ -~]{0,12}",
            tail in "[ -~]{0,40}",
        ) {
            let users = ALICE.with(|a| Users(a.0.clone()));
            for mechanism in Mechanism::ALL {
                for tokens in [
                    vec![first.clone(), last.clone()],
                    vec![format!("n,,n={user},r={nonce}").into_bytes(), format!("c=biws,r={nonce}{tail}").into_bytes()],
                    vec![format!("n,,n=alice,r={nonce}").into_bytes(), tail.clone().into_bytes()],
                ] {
                    let mut auth = Authenticator::new(vec![mechanism]);
                    auth.handshake(mechanism.name(), 1).unwrap();
                    for token in tokens {
                        if let Ok(Step::Done { user, .. }) = auth.authenticate(&token, &users) {
                            proptest::prop_assert!(false, "{user} logged in without the password");
                        }
                    }
                }
            }
        }
    }

    thread_local! {
        static ALICE: Users = alice();
    }

    #[test]
    fn a_mechanism_not_enabled_and_steps_out_of_turn_are_refused() {
        let users = alice();
        let mut auth = Authenticator::new(vec![Mechanism::Scram(Hash::Sha512)]);
        assert_eq!(auth.handshake("PLAIN", 1).unwrap_err().code, ErrorCode::UnsupportedSaslMechanism);
        assert_eq!(auth.handshake("SCRAM-SHA-512", 1).unwrap_err().code, ErrorCode::IllegalSaslState);
        let mut auth = Authenticator::new(vec![Mechanism::Plain]);
        assert_eq!(auth.authenticate(b"\0alice\0pw", &users).unwrap_err().code, ErrorCode::IllegalSaslState);
        let mut auth = Authenticator::new(vec![Mechanism::Plain]);
        auth.handshake("PLAIN", 0).unwrap();
        assert!(auth.expects_bare_token());
        auth.authenticate(b"\0alice\0pw", &users).unwrap();
        assert!(!auth.expects_bare_token());
        assert_eq!(auth.authenticate(b"\0alice\0pw", &users).unwrap_err().code, ErrorCode::IllegalSaslState);
    }
}
