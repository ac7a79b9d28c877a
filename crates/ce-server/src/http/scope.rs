//! A [`Principal`]'s rules applied to the store: the checks and filters every tenant route
//! goes through (DESIGN.md decisions 9 and 14).
//!
//! - Account: a URI of another account is `404 not_found` for reads (exactly the answer of
//!   a node that does not exist) and `403 forbidden` for writes (which says nothing about
//!   existence). These checks are pure and cost nothing.
//! - Owner spaces (keys with `owner_spaces`): a node of another space is invisible: reads
//!   and writes that need it answer `404`, listings, relations and search hits leave it out,
//!   and a write that would leave a node in such a space is `403`. These checks read the
//!   node(s) first; the store write that follows is a separate transaction, so a concurrent
//!   change of a node's owner space within the account can slip between check and write.
//!   Account isolation has no such window: a node never changes account.
//! - Admins (and every caller when no key is configured) pass every check for free.
//!
//! A new route applies it with [`super::handlers`]' `scoped` helper: check its input URIs
//! with [`Scope::check_read`] / [`Scope::check_write`] (or [`Principal::scope_filter`] for a
//! search filter), and pass what it returns through [`Scope::retain`].

use std::collections::HashMap;

use ce_core::{ContextNode, CtxUri, OwnerSpace, PathDefaults};
use ce_store::{ContextFs, NodeStat, PutMode, PutRequest, Relations, StoreError};

use super::auth::{AuthError, Principal};
use super::error::ApiError;

type Result<T, E = ApiError> = std::result::Result<T, E>;

/// A caller's view of the store.
pub struct Scope<'a> {
    p: &'a Principal,
    fs: &'a dyn ContextFs,
}

fn hidden(uri: &CtxUri) -> ApiError {
    AuthError::Hidden { uri: uri.clone() }.into()
}

fn forbidden(reason: String) -> ApiError {
    AuthError::Forbidden(reason).into()
}

impl<'a> Scope<'a> {
    /// `p`'s view of `fs`.
    pub fn new(p: &'a Principal, fs: &'a dyn ContextFs) -> Self {
        Scope { p, fs }
    }

    /// The caller.
    pub fn principal(&self) -> &Principal {
        self.p
    }

    /// The node at `uri` if the caller sees it, else `404` as for a missing node.
    pub fn read_node(&self, uri: &CtxUri) -> Result<ContextNode> {
        self.p.check_read(uri)?;
        let node = self
            .fs
            .read_node(uri)?
            .ok_or_else(|| StoreError::NodeNotFound { uri: uri.clone() })?;
        if !self.p.may_own(&node.owner_space) {
            return Err(hidden(uri));
        }
        Ok(node)
    }

    /// The stat of `uri` if the caller sees it, else `404`.
    pub fn stat(&self, uri: &CtxUri) -> Result<NodeStat> {
        self.p.check_read(uri)?;
        let stat = self.fs.stat(uri)?;
        if !self.p.may_own(&stat.owner_space) {
            return Err(hidden(uri));
        }
        Ok(stat)
    }

    /// Checks that the caller may read `uri` (`404` if not); reads the node only when
    /// owner spaces restrict the caller (then the node must exist).
    pub fn check_read(&self, uri: &CtxUri) -> Result<()> {
        self.p.check_read(uri)?;
        if self.p.restricts_spaces() {
            self.read_node(uri)?;
        }
        Ok(())
    }

    /// Checks that the caller may change the existing node `uri`: `403` outside its
    /// account, `404` when owner spaces hide the node (or it does not exist).
    pub fn check_write(&self, uri: &CtxUri) -> Result<()> {
        self.p.check_write(uri)?;
        if self.p.restricts_spaces() {
            self.read_node(uri)?;
        }
        Ok(())
    }

    /// A listing may start at the caller's account node even when owner spaces hide it:
    /// the listing itself shows only what the caller sees.
    fn check_listing_start(&self, uri: &CtxUri) -> Result<()> {
        self.p.check_read(uri)?;
        if uri.depth() == 1 {
            return Ok(());
        }
        self.check_read(uri)
    }

    fn retain_stats(&self, mut stats: Vec<NodeStat>) -> Vec<NodeStat> {
        stats.retain(|s| self.p.visible(&s.uri, &s.owner_space));
        stats
    }

    /// The URI of a tenant's account node.
    fn account_uri(account: &str) -> Option<CtxUri> {
        CtxUri::root().join(account).ok()
    }

    /// `ls`: the root lists only the caller's account.
    pub fn ls(&self, uri: &CtxUri) -> Result<Vec<NodeStat>> {
        if let (true, Some(account)) = (uri.is_root(), self.p.account_id()) {
            let Some(acc) = Self::account_uri(account) else {
                return Ok(Vec::new());
            };
            return match self.fs.stat(&acc) {
                Ok(s) => Ok(self.retain_stats(vec![s])),
                Err(StoreError::NodeNotFound { .. }) => Ok(Vec::new()),
                Err(e) => Err(e.into()),
            };
        }
        self.check_listing_start(uri)?;
        Ok(self.retain_stats(self.fs.ls(uri)?))
    }

    /// `tree`: from the root, only the caller's account.
    pub fn tree(&self, uri: &CtxUri, depth: Option<u32>) -> Result<Vec<NodeStat>> {
        if let (true, Some(account)) = (uri.is_root(), self.p.account_id()) {
            if depth == Some(0) {
                return Ok(Vec::new());
            }
            let Some(acc) = Self::account_uri(account) else {
                return Ok(Vec::new());
            };
            return match self.fs.tree(&acc, depth.map(|d| d - 1)) {
                Ok(v) => Ok(self.retain_stats(v)),
                Err(StoreError::NodeNotFound { .. }) => Ok(Vec::new()),
                Err(e) => Err(e.into()),
            };
        }
        self.check_listing_start(uri)?;
        Ok(self.retain_stats(self.fs.tree(uri, depth)?))
    }

    /// `put`: `403` outside the account, onto a node of a hidden owner space, or when the
    /// node would end up in one. (Missing ancestors are created as empty containers with
    /// their path's owner space, whichever it is: they hold no text.)
    pub fn check_put(&self, uri: &CtxUri, req: &PutRequest) -> Result<()> {
        self.p.check_write(uri)?;
        if !self.p.restricts_spaces() {
            return Ok(());
        }
        let existing = self.fs.read_node(uri)?;
        if let Some(n) = &existing {
            self.p.check_owner(uri, &n.owner_space)?;
        }
        let owner = match (&req.owner_space, &existing, req.mode) {
            (Some(o), _, _) => o.clone(),
            (None, Some(n), PutMode::Merge | PutMode::Append) => n.owner_space.clone(),
            (None, _, _) => PathDefaults::of(uri).owner_space,
        };
        Ok(self.p.check_owner(uri, &owner)?)
    }

    /// Every node of the subtree at `uri` must be visible (`uri` itself: `404`; below it:
    /// `403`). Returns the nodes.
    fn visible_subtree(&self, uri: &CtxUri) -> Result<Vec<ContextNode>> {
        let nodes = self.fs.read_subtree(uri)?;
        match nodes.iter().find(|n| n.uri == *uri) {
            Some(n) if self.p.may_own(&n.owner_space) => {}
            Some(_) => return Err(hidden(uri)),
            None => return Err(StoreError::NodeNotFound { uri: uri.clone() }.into()),
        }
        if nodes.iter().any(|n| !self.p.may_own(&n.owner_space)) {
            return Err(forbidden(format!(
                "the subtree of {uri} holds nodes outside the owner spaces of this API key"
            )));
        }
        Ok(nodes)
    }

    /// `rm`: `403` outside the account; with owner spaces, the node (`404`) and, when
    /// recursive, its whole subtree (`403`) must be visible.
    pub fn check_rm(&self, uri: &CtxUri, recursive: bool) -> Result<()> {
        self.p.check_write(uri)?;
        if !self.p.restricts_spaces() {
            return Ok(());
        }
        if recursive {
            self.visible_subtree(uri)?;
            Ok(())
        } else {
            self.check_write(uri)
        }
    }

    /// `mv`: both ends in the account (`403`); with owner spaces, the moved subtree must be
    /// visible and every moved node must stay in a visible owner space (owner spaces that
    /// follow the path are re-derived by a move).
    pub fn check_mv(&self, from: &CtxUri, to: &CtxUri) -> Result<()> {
        self.p.check_write(from)?;
        self.p.check_write(to)?;
        if !self.p.restricts_spaces() {
            return Ok(());
        }
        for n in self.visible_subtree(from)? {
            // A URI the move cannot produce is refused by the store itself.
            let Ok(moved) = n.uri.rebase(from, to) else {
                continue;
            };
            let owner = if n.owner_space == PathDefaults::of(&n.uri).owner_space {
                PathDefaults::of(&moved).owner_space
            } else {
                n.owner_space.clone()
            };
            self.p.check_owner(&moved, &owner)?;
        }
        Ok(())
    }

    /// `link` / `unlink`: both nodes in the account (`403`: an edge never crosses
    /// accounts for a tenant); with owner spaces, both must be visible (`404`).
    pub fn check_link(&self, from: &CtxUri, to: &CtxUri) -> Result<()> {
        self.p.check_write(from)?;
        self.p.check_write(to)?;
        if self.p.restricts_spaces() {
            self.read_node(from)?;
            self.read_node(to)?;
        }
        Ok(())
    }

    /// Drops the items whose node (`uri_of`) the caller does not see: outside its account,
    /// or — for keys with owner spaces — a node that is gone or of another space (one
    /// batched read).
    pub fn retain<T>(&self, items: &mut Vec<T>, uri_of: impl Fn(&T) -> &CtxUri) -> Result<()> {
        if self.p.is_admin() {
            return Ok(());
        }
        items.retain(|i| self.p.in_account(uri_of(i)));
        if !self.p.restricts_spaces() || items.is_empty() {
            return Ok(());
        }
        let mut uris: Vec<CtxUri> = items.iter().map(|i| uri_of(i).clone()).collect();
        uris.sort();
        uris.dedup();
        let owners: HashMap<CtxUri, OwnerSpace> = self
            .fs
            .read_nodes(&uris)?
            .into_iter()
            .map(|n| (n.uri, n.owner_space))
            .collect();
        items.retain(|i| owners.get(uri_of(i)).is_some_and(|o| self.p.may_own(o)));
        Ok(())
    }

    /// A node's relations without the edges whose other end the caller does not see.
    pub fn relations(&self, mut r: Relations) -> Result<Relations> {
        self.retain(&mut r.outgoing, |e| &e.to_uri)?;
        self.retain(&mut r.incoming, |e| &e.from_uri)?;
        Ok(r)
    }
}
