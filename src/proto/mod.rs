//! The socket protocol (ARCHITECTURE.md#interfaces): one JSON object per line each way.
//!
//! Request:  `{"type": "set", "mode": "integrated", "force": false}`
//! (an optional `"proto": N` names the protocol version the client speaks).
//! Response: `{"ok": true, "proto": 1, "data": …}` or
//! `{"ok": false, "proto": 1, "error": {"code": "refused", "message": "…"}}`.
//!
//! - [`data`]: the typed payload of each answer (`data`),
//! - [`event`]: the lines an `events` subscription streams,
//! - [`redact`]: what a viewer who is neither root nor the group sees.
//!
//! The JSON of each is documented in `docs/PROTOCOL.md`.

pub mod data;
pub mod event;
#[cfg(test)]
mod golden;
pub mod redact;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The protocol version this build speaks.
pub const PROTO: u32 = 1;
/// Longest accepted line, newline included.
pub const MAX_LINE: usize = 64 * 1024;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    Ping {},
    List {},
    Get {},
    Set {
        mode: String,
        #[serde(default)]
        force: bool,
    },
    Block {
        gpu: String,
        #[serde(default)]
        force: bool,
    },
    Unblock {
        gpu: String,
    },
    Status {},
    Who {
        #[serde(default)]
        gpu: Option<String>,
    },
    /// `gpuctl run`: grant the caller's own process (SO_PEERCRED) access
    /// to one GPU (default: the offload GPU).
    Grant {
        #[serde(default)]
        gpu: Option<String>,
        #[serde(default)]
        only: bool,
    },
    /// Per-application policy.
    App {
        action: AppAction,
        #[serde(default)]
        path: Option<String>,
        #[serde(default)]
        gpu: Option<String>,
        /// `allow`/`deny`: the program itself comes with the request line
        /// as one O_PATH descriptor (SCM_RIGHTS), so the daemon needs no
        /// access to `path` (its unit hides `/home` and `/tmp`); `path`
        /// is then only the rule's name. `false`: the daemon opens `path`.
        #[serde(default)]
        fd: bool,
    },
    /// Turn this connection into a stream of events (denied, wake, sleep, power).
    Events {},
    /// Recent wakes of the offload GPUs (one GPU, or all), and their residency.
    Wakes {
        #[serde(default)]
        gpu: Option<String>,
    },
    /// Automatic modes: turn on, off, or report (`None`: report).
    Auto {
        #[serde(default)]
        action: Option<AutoAction>,
    },
    /// Read the config, one key, or set one key.
    Config {
        #[serde(default)]
        key: Option<String>,
        #[serde(default)]
        value: Option<String>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AutoAction {
    On,
    Off,
    Status,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AppAction {
    Allow,
    Deny,
    Forget,
    List,
}

impl Request {
    /// Whether the request line comes with one descriptor (SCM_RIGHTS).
    /// Any other request that brings one is refused.
    pub fn takes_fd(&self) -> bool {
        matches!(
            self,
            Request::App {
                action: AppAction::Allow | AppAction::Deny,
                fd: true,
                ..
            }
        )
    }

    /// Whether the request changes state (and so needs authorization).
    pub fn is_change(&self) -> bool {
        match self {
            Request::Set { .. } | Request::Block { .. } | Request::Unblock { .. } => true,
            Request::App { action, .. } => *action != AppAction::List,
            Request::Config { value, .. } => value.is_some(),
            Request::Auto { action } => matches!(action, Some(AutoAction::On | AutoAction::Off)),
            _ => false,
        }
    }
}

/// Error codes a client can act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    /// Not JSON, not an object, an unknown type or field.
    BadRequest,
    /// A line over [`MAX_LINE`].
    TooLarge,
    /// The client said nothing (or not a whole line) in time.
    Timeout,
    /// A newer protocol version than this daemon speaks.
    UnsupportedVersion,
    /// The caller may read but not change.
    PermissionDenied,
    /// The GPU argument names no GPU.
    UnknownGpu,
    /// The rules refuse the change (the message says why).
    Refused,
    /// The daemon failed (the message says where).
    Internal,
    /// Too many clients at once.
    Busy,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: Code,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    pub proto: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

impl Response {
    pub fn ok(data: Value) -> Self {
        Response {
            ok: true,
            proto: PROTO,
            data: Some(data),
            error: None,
        }
    }

    /// The payload as `T` (at the client's edge): `Err` says what is wrong
    /// with it, or the daemon's error message.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, String> {
        if let Some(e) = &self.error {
            return Err(e.message.clone());
        }
        let data = self.data.clone().unwrap_or(Value::Null);
        serde_json::from_value(data)
            .map_err(|e| format!("the daemon's answer is not understood: {e}"))
    }

    pub fn err(code: Code, message: impl Into<String>) -> Self {
        Response {
            ok: false,
            proto: PROTO,
            data: None,
            error: Some(ErrorBody {
                code,
                message: message.into(),
            }),
        }
    }

    /// The response as one line, newline included.
    pub fn to_line(&self) -> Vec<u8> {
        // Serializing these plain types cannot fail; if it ever did, the
        // client still gets a well-formed error line.
        let mut line = serde_json::to_vec(self).unwrap_or_else(|_| {
            br#"{"ok":false,"proto":1,"error":{"code":"internal","message":"response encoding failed"}}"#
                .to_vec()
        });
        line.push(b'\n');
        line
    }
}

/// Decodes one request line (without its newline).
pub fn decode(line: &[u8]) -> Result<Request, Response> {
    let value: Value = serde_json::from_slice(line)
        .map_err(|e| Response::err(Code::BadRequest, format!("not valid JSON: {e}")))?;
    let Value::Object(mut obj) = value else {
        return Err(Response::err(
            Code::BadRequest,
            "a request is a JSON object with a \"type\" field",
        ));
    };
    if let Some(v) = obj.remove("proto") {
        match v.as_u64() {
            Some(p) if p <= u64::from(PROTO) => {}
            _ => {
                return Err(Response::err(
                    Code::UnsupportedVersion,
                    format!("this daemon speaks protocol {PROTO}; the request asked for {v}"),
                ))
            }
        }
    }
    serde_json::from_value(Value::Object(obj))
        .map_err(|e| Response::err(Code::BadRequest, format!("bad request: {e}")))
}

/// Encodes one request as a line, newline included.
pub fn encode(req: &Request) -> Vec<u8> {
    let mut v = serde_json::to_value(req).unwrap_or(Value::Null);
    if let Value::Object(o) = &mut v {
        o.insert("proto".into(), PROTO.into());
    }
    let mut line = v.to_string().into_bytes();
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for req in [
            Request::Ping {},
            Request::List {},
            Request::Set {
                mode: "integrated".into(),
                force: true,
            },
            Request::Block {
                gpu: "01:00.0".into(),
                force: false,
            },
            Request::Who { gpu: None },
            Request::Grant {
                gpu: Some("1".into()),
                only: true,
            },
            Request::App {
                action: AppAction::Allow,
                path: Some("/usr/bin/game".into()),
                gpu: None,
                fd: true,
            },
            Request::Events {},
            Request::Auto {
                action: Some(AutoAction::Off),
            },
            Request::Auto { action: None },
        ] {
            let line = encode(&req);
            assert_eq!(line.last(), Some(&b'\n'));
            assert_eq!(decode(&line[..line.len() - 1]).unwrap(), req);
        }
    }

    #[test]
    fn bad_requests_get_codes() {
        let code = |l: &str| decode(l.as_bytes()).unwrap_err().error.unwrap().code;
        assert_eq!(code("{"), Code::BadRequest);
        assert_eq!(code("[1]"), Code::BadRequest);
        assert_eq!(code(r#"{"type":"explode"}"#), Code::BadRequest);
        assert_eq!(code(r#"{"type":"set"}"#), Code::BadRequest);
        assert_eq!(code(r#"{"type":"get","extra":1}"#), Code::BadRequest);
        assert_eq!(
            code(r#"{"type":"get","proto":99}"#),
            Code::UnsupportedVersion
        );
        assert!(decode(br#"{"type":"get","proto":1}"#).is_ok());
        assert!(decode(br#"{"type":"set","mode":"hybrid"}"#).is_ok());
    }

    /// Arbitrary bytes and mutated valid requests never panic the decoder;
    /// every failure is an error response with a code.
    #[test]
    fn decoder_survives_garbage() {
        let seeds: Vec<Vec<u8>> = [
            r#"{"type":"set","mode":"integrated","force":true}"#,
            r#"{"type":"app","action":"allow","path":"/usr/bin/x","gpu":"1"}"#,
            r#"{"type":"grant","gpu":null,"only":false,"proto":1}"#,
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..20_000 {
            let mut b = seeds[i % seeds.len()].clone();
            for _ in 0..(next() % 6) {
                let pos = (next() as usize) % (b.len() + 1);
                match next() % 3 {
                    0 if pos < b.len() => b[pos] = next() as u8,
                    1 => b.insert(pos, next() as u8),
                    _ if pos < b.len() => {
                        b.remove(pos);
                    }
                    _ => {}
                }
            }
            if let Err(r) = decode(&b) {
                assert!(!r.ok && r.error.is_some());
            }
        }
    }

    #[test]
    fn response_shape() {
        let r = Response::err(Code::Refused, "no");
        let v: Value = serde_json::from_slice(&r.to_line()).unwrap();
        assert_eq!(v["ok"], false);
        assert_eq!(v["error"]["code"], "refused");
        assert!(v.get("data").is_none());
    }
}
