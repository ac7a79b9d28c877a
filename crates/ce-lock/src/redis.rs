//! The `redis` provider: tokens in one Redis HASH per provider scope, every batch checked and
//! written by one Lua script, so the check-and-set is atomic on the server and coordinates
//! every host that reaches it (spec "Cache Provider 锁协议").
//!
//! Key layout (`{service}` is the Redis Cluster hash tag, so every key of a namespace lives in
//! one slot and a script may touch them together):
//!
//! - `{service}:ctx:pathlock:scope:account:{account}:tokens`: the tokens of one account's paths
//! - `{service}:ctx:pathlock:global:tokens`: the token of the root `ctx://`
//! - `{service}:ctx:pathlock:fence`: the fencing counter
//!
//! A hash field is the canonical URI; its value is the spec's token plus the grant's fence,
//! `{owner}:{time_ns}:{E|T}:{fence}`. One field holds one token except when one owner holds
//! both modes on the path (two grants), or a hand-off moved one of them: then the tokens are
//! joined by `,` (one token per (path, mode), as the other providers keep them).
//!
//! Acquire: EXACT reads the path and its ancestors (HMGET), TREE reads the whole scope hash
//! (HGETALL, for the descendants); stale tokens met are removed; a live conflicting token of
//! another owner ends the script before anything is written. Fences come from INCR, floored by
//! the wall clock in microseconds so that a Redis that lost the counter (restart without
//! persistence) still issues tokens above the ones it issued before.

use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ::redis::{Client, Connection, RedisError, Script};
use ce_core::CtxUri;

use crate::{
    Attempt, FenceToken, LockError, LockMode, LockProvider, LockRequest, Result, Token, scope_of,
};

/// Connect, read and write timeout of the Redis connection.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

const PROVIDER: &str = "redis";

/// The token format both scripts read and write (prepended to each): `parse` splits a field
/// value into its tokens — an unreadable one counts as a live foreign TREE lock (owner `?`,
/// which no lease id can equal) — and `render` joins them back.
const TOKENS_LUA: &str = r#"
local function parse(v)
  local out = {}
  for raw in string.gmatch(v, '[^,]+') do
    local o, t, m, f = string.match(raw, '^([^:]+):(%d+):([ET]):(%d+)$')
    if o then
      out[#out + 1] = {o = o, t = t, m = m, f = f}
    else
      out[#out + 1] = {bad = raw, o = '?', m = 'T'}
    end
  end
  return out
end

local function render(toks)
  local parts = {}
  for _, k in ipairs(toks) do
    parts[#parts + 1] = k.bad or (k.o .. ':' .. k.t .. ':' .. k.m .. ':' .. k.f)
  end
  return table.concat(parts, ',')
end
"#;

/// Batch check-and-set. KEYS: scope hash, fence counter. ARGV: owner, now_ns, cutoff (a token
/// stamped before it is stale), fence floor (µs), n, then n × (path, E|T). Returns
/// `{"ok", fence}` or `{"conflict", field, mode, owner}`.
const ACQUIRE_LUA: &str = r#"
local hash, fence_key = KEYS[1], KEYS[2]
local owner, now, cutoff, floor = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local n = tonumber(ARGV[5])

-- Digit strings compared as numbers (Lua numbers lose precision above 2^53).
local function older(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end


-- The live tokens of field f (value v or false); stale ones are removed from the hash.
local function live(f, v)
  if not v then return {} end
  local all, keep = parse(v), {}
  for _, k in ipairs(all) do
    if k.bad or not older(k.t, cutoff) then keep[#keep + 1] = k end
  end
  if #keep ~= #all then
    if #keep == 0 then redis.call('HDEL', hash, f) else redis.call('HSET', hash, f, render(keep)) end
  end
  return keep
end

-- Whether a strictly lies below b.
local function below(a, b)
  return string.sub(a, 1, #b + 1) == b .. '/'
end

-- Whether token k at field f blocks a request (p, m) of `owner`: conflicts() of lib.rs.
local function blocks(f, k, p, m)
  if k.o == owner then return false end
  if f == p then return true end
  if k.m == 'T' and below(p, f) then return true end
  if m == 'T' and below(f, p) then return true end
  return false
end

for i = 1, n do
  local p, m = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
  local fields, vals = {}, {}
  if m == 'E' then
    fields[1] = p
    local from = 7 -- after 'ctx://'
    while true do
      local j = string.find(p, '/', from, true)
      if not j then break end
      fields[#fields + 1] = string.sub(p, 1, j - 1)
      from = j + 1
    end
    vals = redis.call('HMGET', hash, unpack(fields))
  else
    local flat = redis.call('HGETALL', hash)
    for j = 1, #flat, 2 do
      fields[#fields + 1] = flat[j]
      vals[#vals + 1] = flat[j + 1]
    end
  end
  for j, f in ipairs(fields) do
    for _, k in ipairs(live(f, vals[j])) do
      if blocks(f, k, p, m) then
        return {'conflict', f, k.m, k.o}
      end
    end
  end
end

local v = redis.call('INCR', fence_key)
local fence
if v < tonumber(floor) then
  redis.call('SET', fence_key, floor)
  fence = floor
else
  fence = string.format('%d', v)
end

for i = 1, n do
  local p, m = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
  local keep = {}
  for _, k in ipairs(live(p, redis.call('HGET', hash, p))) do
    if not (k.o == owner and k.m == m) then keep[#keep + 1] = k end
  end
  keep[#keep + 1] = {o = owner, t = now, m = m, f = fence}
  redis.call('HSET', hash, p, render(keep))
end
return {'ok', fence}
"#;

/// Compare-and-set on tokens. KEYS: the scope hashes involved. ARGV: op (`refresh`,
/// `transfer` or `release`), now_ns, new owner, n, then n × (key index, path, E|T, owner,
/// fence). A token matches when its field holds an entry of the same mode, owner and fence.
/// Refresh and transfer check every token first and return `{"lost", i, value}` for the first
/// missing one, writing nothing; release removes the matching ones and skips the others.
const UPDATE_LUA: &str = r#"
local op, now, new_owner = ARGV[1], ARGV[2], ARGV[3]
local n = tonumber(ARGV[4])


local function token(i)
  local b = 4 + 5 * (i - 1)
  return KEYS[tonumber(ARGV[b + 1])], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], ARGV[b + 5]
end

-- The entries of the field and the index of the matching one (or nil).
local function find(hash, p, m, o, f)
  local v = redis.call('HGET', hash, p)
  if not v then return {}, nil, '' end
  local toks = parse(v)
  for j, k in ipairs(toks) do
    if not k.bad and k.m == m and k.o == o and k.f == f then return toks, j, v end
  end
  return toks, nil, v
end

if op ~= 'release' then
  for i = 1, n do
    local hash, p, m, o, f = token(i)
    local _, j, v = find(hash, p, m, o, f)
    if not j then return {'lost', tostring(i), v} end
  end
end

for i = 1, n do
  local hash, p, m, o, f = token(i)
  local toks, j = find(hash, p, m, o, f)
  if j then
    if op == 'release' then
      table.remove(toks, j)
    else
      toks[j].t = now
      if op == 'transfer' then toks[j].o = new_owner end
    end
    if #toks == 0 then redis.call('HDEL', hash, p) else redis.call('HSET', hash, p, render(toks)) end
  end
end
return {'ok'}
"#;

/// The `redis` provider: one connection (reconnected after any failure) to a standalone
/// Redis, keys namespaced by a service name.
pub struct RedisProvider {
    client: Client,
    conn: Mutex<Option<Connection>>,
    /// `{service}:ctx:pathlock:`.
    prefix: String,
    /// `ce-lock:{service}` (non-graphic characters as `_`), set by CLIENT SETNAME.
    client_name: String,
    acquire: Script,
    update: Script,
}

impl fmt::Debug for RedisProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisProvider")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// The key prefix of a service namespace: `{service}:ctx:pathlock:`.
pub fn key_prefix(service_name: &str) -> String {
    format!("{{{service_name}}}:ctx:pathlock:")
}

/// The connection name of a service namespace: `ce-lock:{service}`, spaces and control
/// characters replaced (CLIENT SETNAME refuses them).
pub fn client_name(service_name: &str) -> String {
    let clean: String = service_name
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '_' })
        .collect();
    format!("ce-lock:{clean}")
}

fn provider_error(what: &str, e: &RedisError) -> LockError {
    LockError::Provider {
        provider: PROVIDER,
        message: format!("{what}: {e}"),
    }
}

fn malformed(what: &str, reply: &[String]) -> LockError {
    LockError::Provider {
        provider: PROVIDER,
        message: format!("{what}: unexpected script reply {reply:?}"),
    }
}

/// The fence floor: the later of `now_ns` and this host's clock, in microseconds.
fn fence_floor_us(now_ns: u64) -> u64 {
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    now_ns.max(wall) / 1_000
}

fn check_owner(owner: &str) -> Result<()> {
    if owner.is_empty() || owner.contains([':', ',']) {
        return Err(LockError::Invalid(format!(
            "lock owner {owner:?} must be non-empty without ':' or ','"
        )));
    }
    Ok(())
}

impl RedisProvider {
    /// Connects to the Redis at `url` (`redis://[user:password@]host[:port][/db]`) and
    /// namespaces the keys by `service_name` (the Redis Cluster hash tag). Fails with
    /// [`LockError::Invalid`] on a bad URL or name and [`LockError::Provider`] when Redis does
    /// not answer.
    pub fn connect(url: &str, service_name: &str) -> Result<RedisProvider> {
        if service_name.is_empty() || service_name.contains(['{', '}']) {
            return Err(LockError::Invalid(format!(
                "redis service name {service_name:?} must be non-empty without braces"
            )));
        }
        let client =
            Client::open(url).map_err(|e| LockError::Invalid(format!("redis url: {e}")))?;
        let provider = RedisProvider {
            client,
            conn: Mutex::new(None),
            prefix: key_prefix(service_name),
            client_name: client_name(service_name),
            acquire: Script::new(&format!("{TOKENS_LUA}{ACQUIRE_LUA}")),
            update: Script::new(&format!("{TOKENS_LUA}{UPDATE_LUA}")),
        };
        provider.with_conn("ping", |c| ::redis::cmd("PING").query::<String>(c))?;
        Ok(provider)
    }

    /// The hash key of a path's scope.
    pub fn scope_key(&self, path: &CtxUri) -> String {
        match scope_of(path) {
            Some(account) => format!("{}scope:account:{account}:tokens", self.prefix),
            None => format!("{}global:tokens", self.prefix),
        }
    }

    /// The key of the fencing counter.
    pub fn fence_key(&self) -> String {
        format!("{}fence", self.prefix)
    }

    fn conn(&self) -> MutexGuard<'_, Option<Connection>> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the connection, opening it first if needed; any failure drops the
    /// connection (a timed-out reply may still arrive on it) so the next call reconnects.
    fn with_conn<T>(
        &self,
        what: &str,
        f: impl FnOnce(&mut Connection) -> Result<T, RedisError>,
    ) -> Result<T> {
        let mut guard = self.conn();
        let c = match &mut *guard {
            Some(c) => c,
            slot @ None => slot.insert(self.open().map_err(|e| provider_error("connect", &e))?),
        };
        match f(c) {
            Ok(v) => Ok(v),
            Err(e) => {
                *guard = None;
                tracing::warn!(error = %e, what, "redis lock provider call failed");
                Err(provider_error(what, &e))
            }
        }
    }

    fn open(&self) -> Result<Connection, RedisError> {
        let mut c = self.client.get_connection_with_timeout(IO_TIMEOUT)?;
        c.set_read_timeout(Some(IO_TIMEOUT))?;
        c.set_write_timeout(Some(IO_TIMEOUT))?;
        // Named so operators (and tests) can find the lock connections in CLIENT LIST.
        ::redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg(&self.client_name)
            .query::<()>(&mut c)?;
        Ok(c)
    }

    fn location(&self, key: &str, req: &LockRequest) -> String {
        format!("{key} {} {}", req.path, req.mode.letter())
    }

    /// Runs the update script over `tokens`; `Some(i)` names the first token not stored as
    /// written (refresh and transfer only).
    fn update(
        &self,
        op: &str,
        tokens: &[Token],
        new_owner: &str,
        now_ns: u64,
    ) -> Result<Option<(usize, String)>> {
        if tokens.is_empty() {
            return Ok(None);
        }
        let mut keys: Vec<String> = Vec::new();
        let mut inv = self.update.prepare_invoke();
        inv.arg(op)
            .arg(now_ns.to_string())
            .arg(new_owner)
            .arg(tokens.len());
        for t in tokens {
            let key = self.scope_key(&t.request.path);
            let idx = match keys.iter().position(|k| *k == key) {
                Some(i) => i,
                None => {
                    keys.push(key);
                    keys.len() - 1
                }
            };
            inv.arg(idx + 1)
                .arg(t.request.path.as_str())
                .arg(t.request.mode.letter().to_string())
                .arg(&t.owner)
                .arg(t.fence.0.to_string());
        }
        for k in &keys {
            inv.key(k);
        }
        let reply: Vec<String> = self.with_conn(op, |c| inv.invoke(c))?;
        match reply.as_slice() {
            [ok] if ok == "ok" => Ok(None),
            [lost, i, value] if lost == "lost" => {
                let i: usize = i.parse().map_err(|_| malformed(op, &reply))?;
                Ok(Some((i.saturating_sub(1), value.clone())))
            }
            _ => Err(malformed(op, &reply)),
        }
    }

    /// Refresh or transfer: [`LockError::Lost`] for a token not stored as written.
    fn rewrite(
        &self,
        op: &str,
        tokens: &[Token],
        owner: Option<&str>,
        now_ns: u64,
    ) -> Result<Vec<Token>> {
        if let Some(o) = owner {
            check_owner(o)?;
        }
        if let Some((i, value)) = self.update(op, tokens, owner.unwrap_or(""), now_ns)? {
            let t = &tokens[i.min(tokens.len() - 1)];
            let now = if value.is_empty() {
                "nothing"
            } else {
                value.as_str()
            };
            return Err(LockError::Lost {
                path: t.request.path.clone(),
                reason: format!(
                    "{:?} token of {} (fence {}) gone or replaced: field holds {now}",
                    t.request.mode, t.owner, t.fence
                ),
            });
        }
        Ok(tokens
            .iter()
            .map(|t| Token {
                owner: owner.unwrap_or(&t.owner).to_owned(),
                time_ns: now_ns,
                ..t.clone()
            })
            .collect())
    }
}

impl LockProvider for RedisProvider {
    fn name(&self) -> &'static str {
        PROVIDER
    }

    fn try_acquire(
        &self,
        owner: &str,
        reqs: &[LockRequest],
        now_ns: u64,
        expire_ns: u64,
    ) -> Result<Vec<Token>, Attempt> {
        check_owner(owner)?;
        let Some(first) = reqs.first() else {
            return Err(LockError::Invalid("empty lock batch".into()).into());
        };
        let scope = scope_of(&first.path);
        if let Some(other) = reqs.iter().find(|r| scope_of(&r.path) != scope) {
            return Err(LockError::Invalid(format!(
                "lock batch spans scopes: {} and {}",
                first.path, other.path
            ))
            .into());
        }
        let key = self.scope_key(&first.path);
        let mut inv = self.acquire.key(&key);
        inv.key(self.fence_key())
            .arg(owner)
            .arg(now_ns.to_string())
            .arg(now_ns.saturating_sub(expire_ns).to_string())
            .arg(fence_floor_us(now_ns).to_string())
            .arg(reqs.len());
        for r in reqs {
            inv.arg(r.path.as_str()).arg(r.mode.letter().to_string());
        }
        let reply: Vec<String> = self.with_conn("acquire", |c| inv.invoke(c))?;
        match reply.as_slice() {
            [ok, fence] if ok == "ok" => {
                let fence = FenceToken(fence.parse().map_err(|_| malformed("acquire", &reply))?);
                Ok(reqs
                    .iter()
                    .map(|r| Token {
                        request: r.clone(),
                        owner: owner.to_owned(),
                        time_ns: now_ns,
                        fence,
                        location: self.location(&key, r),
                    })
                    .collect())
            }
            [conflict, field, mode, holder] if conflict == "conflict" => {
                let path = CtxUri::parse(field).map_err(|e| LockError::Provider {
                    provider: PROVIDER,
                    message: format!("acquire: field {field:?} of {key} is not a ctx uri: {e}"),
                })?;
                let mode = if mode == "E" {
                    LockMode::Exact
                } else {
                    LockMode::Tree
                };
                Err(Attempt::Conflict {
                    held: LockRequest { path, mode },
                    owner: holder.clone(),
                })
            }
            _ => Err(malformed("acquire", &reply).into()),
        }
    }

    fn refresh(&self, tokens: &[Token], now_ns: u64) -> Result<Vec<Token>> {
        self.rewrite("refresh", tokens, None, now_ns)
    }

    fn release(&self, tokens: &[Token]) -> Result<()> {
        self.update("release", tokens, "", 0).map(|_| ())
    }

    fn transfer(&self, tokens: &[Token], new_owner: &str, now_ns: u64) -> Result<Vec<Token>> {
        self.rewrite("transfer", tokens, Some(new_owner), now_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_carry_the_service_hash_tag() {
        assert_eq!(key_prefix("svc"), "{svc}:ctx:pathlock:");
    }

    #[test]
    fn fence_floor_never_falls_below_the_argument_or_the_clock() {
        let far = 4_000_000_000_000_000_000;
        assert_eq!(fence_floor_us(far), far / 1_000);
        assert!(fence_floor_us(0) > 1_700_000_000_000_000);
    }

    #[test]
    fn owners_with_separators_are_refused() {
        assert!(check_owner("a-1").is_ok());
        for bad in ["", "a:b", "a,b"] {
            assert!(
                matches!(check_owner(bad), Err(LockError::Invalid(_))),
                "{bad}"
            );
        }
    }
}
