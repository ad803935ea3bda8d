//! Why a request was not done. Handlers return `Result<_, Rejection>` and
//! use `?`; [`Rejection::into_response`] is the one place a rejection
//! becomes a protocol [`Code`].

use crate::policy::Refusal;
use crate::proto::{Code, Response};

#[derive(Debug)]
pub enum Rejection {
    /// The request makes no sense (a bad argument, an unknown key).
    BadRequest(String),
    /// The GPU argument names no GPU.
    UnknownGpu(String),
    /// The rules refuse it (the message says why).
    Refused(String),
    /// The daemon or the kernel failed (the message says where).
    Internal(anyhow::Error),
}

impl Rejection {
    pub fn into_response(self) -> Response {
        match self {
            Rejection::BadRequest(m) => Response::err(Code::BadRequest, m),
            Rejection::UnknownGpu(m) => Response::err(Code::UnknownGpu, m),
            Rejection::Refused(m) => Response::err(Code::Refused, m),
            Rejection::Internal(e) => Response::err(Code::Internal, format!("{e:#}")),
        }
    }
}

impl From<anyhow::Error> for Rejection {
    fn from(e: anyhow::Error) -> Self {
        Rejection::Internal(e)
    }
}

impl From<Refusal> for Rejection {
    fn from(r: Refusal) -> Self {
        Rejection::Refused(r.0)
    }
}

/// `Rejection::Internal` from a message.
pub fn internal(message: impl std::fmt::Display) -> Rejection {
    Rejection::Internal(anyhow::anyhow!("{message}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rejection_has_its_code_and_the_whole_message() {
        use anyhow::Context;
        let e: Result<(), _> = Err(anyhow::anyhow!("EPERM")).context("updating the map");
        let r = Rejection::from(e.unwrap_err()).into_response();
        let body = r.error.unwrap();
        assert_eq!(body.code, Code::Internal);
        assert_eq!(body.message, "updating the map: EPERM");
        let r = Rejection::from(Refusal("refused: a display".into())).into_response();
        assert_eq!(r.error.unwrap().code, Code::Refused);
        assert_eq!(internal("x").into_response().error.unwrap().message, "x");
    }
}
