//! The `memory` provider: tokens in a mutex'd map, coordinating the leases of one process.
//!
//! One token per (path, mode). The whole batch is checked and written under the mutex, so
//! it is atomic; tokens older than `expire` are stale and removed when an acquire meets them.
//! Fences: one counter per provider, floored by the wall clock ([`crate::next_fence`]), one
//! value per grant shared by the batch's tokens.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use ce_core::CtxUri;

use crate::{
    Attempt, FenceToken, LockError, LockMode, LockProvider, LockRequest, Result, Token, conflicts,
    next_fence,
};

/// The `memory` provider.
#[derive(Debug, Default)]
pub struct MemoryProvider {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    tokens: HashMap<(CtxUri, LockMode), Stored>,
    last_fence: u64,
}

#[derive(Debug, Clone, PartialEq)]
struct Stored {
    owner: String,
    time_ns: u64,
    fence: FenceToken,
}

fn location(req: &LockRequest) -> String {
    format!("{}#{}", req.path, req.mode.letter())
}

impl MemoryProvider {
    /// An empty provider.
    pub fn new() -> Self {
        MemoryProvider::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl State {
    /// Whether `t` is still stored as written (owner and fence).
    fn owns(&self, t: &Token) -> bool {
        self.tokens
            .get(&(t.request.path.clone(), t.request.mode))
            .is_some_and(|s| s.owner == t.owner && s.fence == t.fence)
    }

    fn check_owned(&self, tokens: &[Token]) -> Result<()> {
        match tokens.iter().find(|t| !self.owns(t)) {
            Some(t) => Err(LockError::Lost {
                path: t.request.path.clone(),
                reason: format!("{:?} token of {} gone or replaced", t.request.mode, t.owner),
            }),
            None => Ok(()),
        }
    }

    /// Rewrites `tokens` stamped `now_ns`, to `new_owner` when given, keeping their fences.
    fn restamp(&mut self, tokens: &[Token], new_owner: Option<&str>, now_ns: u64) -> Vec<Token> {
        tokens
            .iter()
            .map(|t| {
                let owner = new_owner.unwrap_or(&t.owner);
                let stored = Stored {
                    owner: owner.to_owned(),
                    time_ns: now_ns,
                    fence: t.fence,
                };
                self.tokens
                    .insert((t.request.path.clone(), t.request.mode), stored);
                Token {
                    owner: owner.to_owned(),
                    time_ns: now_ns,
                    ..t.clone()
                }
            })
            .collect()
    }
}

impl LockProvider for MemoryProvider {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn try_acquire(
        &self,
        owner: &str,
        reqs: &[LockRequest],
        now_ns: u64,
        expire_ns: u64,
    ) -> Result<Vec<Token>, Attempt> {
        let mut st = self.state();
        for req in reqs {
            let mut stale = Vec::new();
            for ((path, mode), s) in &st.tokens {
                if s.owner == owner {
                    continue;
                }
                let held = LockRequest {
                    path: path.clone(),
                    mode: *mode,
                };
                if !conflicts(&held, req) {
                    continue;
                }
                if now_ns.saturating_sub(s.time_ns) > expire_ns {
                    stale.push((path.clone(), *mode));
                    continue;
                }
                return Err(Attempt::Conflict {
                    held,
                    owner: s.owner.clone(),
                });
            }
            for key in stale {
                st.tokens.remove(&key);
            }
        }
        let fence = next_fence(st.last_fence, now_ns);
        st.last_fence = fence.0;
        let mut out = Vec::with_capacity(reqs.len());
        for req in reqs {
            st.tokens.insert(
                (req.path.clone(), req.mode),
                Stored {
                    owner: owner.to_owned(),
                    time_ns: now_ns,
                    fence,
                },
            );
            out.push(Token {
                request: req.clone(),
                owner: owner.to_owned(),
                time_ns: now_ns,
                fence,
                location: location(req),
            });
        }
        Ok(out)
    }

    fn refresh(&self, tokens: &[Token], now_ns: u64) -> Result<Vec<Token>> {
        let mut st = self.state();
        st.check_owned(tokens)?;
        Ok(st.restamp(tokens, None, now_ns))
    }

    fn release(&self, tokens: &[Token]) -> Result<()> {
        let mut st = self.state();
        for t in tokens {
            if st.owns(t) {
                st.tokens.remove(&(t.request.path.clone(), t.request.mode));
            }
        }
        Ok(())
    }

    fn transfer(&self, tokens: &[Token], new_owner: &str, now_ns: u64) -> Result<Vec<Token>> {
        let mut st = self.state();
        st.check_owned(tokens)?;
        Ok(st.restamp(tokens, Some(new_owner), now_ns))
    }
}
