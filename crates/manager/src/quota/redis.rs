//! The shared backend: the reference's Redis key model and its two Lua scripts, byte for byte,
//! so oka managers and reference managers can count against one Redis.
//!
//! # Keys (hash-tagged `{K}`: one Cluster slot per owner, no global keys)
//!
//! - `q:live:{K}`: HASH lock → entry JSON ([`Entry::to_json`]).
//! - `q:sum:{K}:sandbox.count`, `q:sum:{K}:limits.cpu`, `q:sum:{K}:limits.memory`: HASH scope →
//!   integer; fields are never deleted (they may read 0) and never negative.
//!
//! Sums and entries change only inside the scripts ([`acquire_script`], [`release_script`]),
//! atomically; both are idempotent. Cleanup (key deleted) is a plain `DEL` of the four keys.
//!
//! # Connection
//!
//! One multiplexed connection (a single-node Redis, no TLS, as the reference), opened on first
//! use and dropped after a transport error or a timeout, so the next call reconnects. Acquires
//! that enforce are bounded by the operation timeout (`--quota-redis-operation-timeout`,
//! 50 ms); the other calls by the maintenance timeout (30 s) unless their caller bounds them
//! tighter. Every failure is [`BackendError::Unavailable`]; the caller fails open.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands as _, IntoConnectionInfo as _};
use tracing::debug;

use super::metrics::QuotaMetrics;
use super::model::{Dimension, Entry, limits_json};
use super::{AcquireParams, BackendError, QuotaBackend};

/// The acquire script's body, with the dimensions placeholder the reference fills in.
const ACQUIRE_BODY: &str = r#"
local lockString = ARGV[1]
local newEntry = cjson.decode(ARGV[2])
local enforce = ARGV[3] == '1'
local limits = {}
if ARGV[4] ~= '' then
	limits = cjson.decode(ARGV[4])
end
local oldRaw = redis.call('HGET', KEYS[1], lockString)
local oldEntry = nil
if oldRaw then
	oldEntry = cjson.decode(oldRaw)
end
-- QUOTA_DIMENSIONS --

local function amount(entry, dim)
	if entry == nil then
		return 0
	end
	if dim == 'sandbox.count' then
		return 1
	end
	if entry['d'] == nil then
		return 0
	end
	local value = entry['d'][dim]
	if value == nil then
		return 0
	end
	return tonumber(value) or 0
end

local function scopeSet(entry)
	local set = {all = true}
	if entry == nil or entry['s'] == nil then
		return set
	end
	for _, scope in ipairs(entry['s']) do
		set[scope] = true
	end
	return set
end

local oldScopes = scopeSet(oldEntry)
local newScopes = scopeSet(newEntry)

local function deltaFor(dim, scope)
	local delta = 0
	if newScopes[scope] then
		delta = delta + amount(newEntry, dim)
	end
	if oldScopes[scope] then
		delta = delta - amount(oldEntry, dim)
	end
	return delta
end

if enforce then
	for _, dim in ipairs(dims) do
		local limitByDim = limits[dim]
		if limitByDim ~= nil then
			for scope, limit in pairs(limitByDim) do
				local delta = deltaFor(dim, scope)
				if delta > 0 then
					local current = tonumber(redis.call('HGET', KEYS[keyIndex[dim]], scope) or '0')
					if current + delta > tonumber(limit) then
						return 'REJECTED'
					end
				end
			end
		end
	end
end

for _, dim in ipairs(dims) do
	local scopes = {}
	for scope, _ in pairs(oldScopes) do
		scopes[scope] = true
	end
	for scope, _ in pairs(newScopes) do
		scopes[scope] = true
	end
	for scope, _ in pairs(scopes) do
		local delta = deltaFor(dim, scope)
		if delta ~= 0 then
			local nextValue = redis.call('HINCRBY', KEYS[keyIndex[dim]], scope, delta)
			if tonumber(nextValue) < 0 then
				redis.call('HSET', KEYS[keyIndex[dim]], scope, 0)
			end
		end
	end
end

if oldRaw ~= ARGV[2] then
	redis.call('HSET', KEYS[1], lockString, ARGV[2])
end
return 'OK'
"#;

/// The release script's body.
const RELEASE_BODY: &str = r#"
local oldRaw = redis.call('HGET', KEYS[1], ARGV[1])
if not oldRaw then
	return 'OK'
end
local oldEntry = cjson.decode(oldRaw)
-- QUOTA_DIMENSIONS --
local scopes = {all = true}
if oldEntry['s'] ~= nil then
	for _, scope in ipairs(oldEntry['s']) do
		scopes[scope] = true
	end
end

local function amount(dim)
	if dim == 'sandbox.count' then
		return 1
	end
	if oldEntry['d'] == nil then
		return 0
	end
	local value = oldEntry['d'][dim]
	if value == nil then
		return 0
	end
	return tonumber(value) or 0
end

for _, dim in ipairs(dims) do
	local delta = amount(dim)
	if delta ~= 0 then
		for scope, _ in pairs(scopes) do
			local nextValue = redis.call('HINCRBY', KEYS[keyIndex[dim]], scope, -delta)
			if tonumber(nextValue) < 0 then
				redis.call('HSET', KEYS[keyIndex[dim]], scope, 0)
			end
		end
	end
end

redis.call('HDEL', KEYS[1], ARGV[1])
return 'OK'
"#;

/// The placeholder the dimension tables replace.
const PLACEHOLDER: &str = "-- QUOTA_DIMENSIONS --";

/// The Lua tables of the dimensions in key order (`KEYS[2..4]`), as the reference generates
/// them.
fn dimension_tables() -> String {
    let dims: Vec<String> = Dimension::ALL.iter().map(|d| format!("\"{}\"", d.as_str())).collect();
    let index: Vec<String> = Dimension::ALL
        .iter()
        .enumerate()
        .map(|(i, d)| format!("[\"{}\"] = {}", d.as_str(), i + 2))
        .collect();
    format!("local dims = {{{}}}\nlocal keyIndex = {{{}}}", dims.join(", "), index.join(", "))
}

/// The acquire script as sent to Redis (the reference's text).
pub fn acquire_script() -> String {
    ACQUIRE_BODY.replacen(PLACEHOLDER, &dimension_tables(), 1)
}

/// The release script as sent to Redis (the reference's text).
pub fn release_script() -> String {
    RELEASE_BODY.replacen(PLACEHOLDER, &dimension_tables(), 1)
}

/// `q:live:{K}`.
pub fn live_key(user: &str) -> String {
    format!("q:live:{{{user}}}")
}

/// `q:sum:{K}:<dimension>`.
pub fn sum_key(user: &str, dimension: Dimension) -> String {
    format!("q:sum:{{{user}}}:{}", dimension.as_str())
}

/// The four keys of an owner, in the scripts' order.
pub fn keys(user: &str) -> [String; 4] {
    [
        live_key(user),
        sum_key(user, Dimension::SandboxCount),
        sum_key(user, Dimension::LimitsCpu),
        sum_key(user, Dimension::LimitsMemory),
    ]
}

/// How to reach Redis.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `host:port`.
    pub addr: String,
    /// The database number.
    pub db: i64,
    /// ACL user (`QUOTA_REDIS_USERNAME`).
    pub username: Option<String>,
    /// Password (`QUOTA_REDIS_PASSWORD`).
    pub password: Option<String>,
    /// The bound of an enforcing acquire (`--quota-redis-operation-timeout`, 50 ms).
    pub operation_timeout: Duration,
    /// The bound of the other calls (30 s, the reference's maintenance timeout).
    pub maintenance_timeout: Duration,
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("addr", &self.addr)
            .field("db", &self.db)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("operation_timeout", &self.operation_timeout)
            .finish_non_exhaustive()
    }
}

impl RedisConfig {
    /// `addr` with the defaults: db 0, no credentials, 50 ms, 30 s.
    pub fn new(addr: impl Into<String>) -> Self {
        Self {
            addr: addr.into(),
            db: 0,
            username: None,
            password: None,
            operation_timeout: Duration::from_millis(50),
            maintenance_timeout: Duration::from_secs(30),
        }
    }
}

/// The Redis backend; see the [module documentation](self).
pub struct RedisBackend {
    client: redis::Client,
    connection: Mutex<Option<MultiplexedConnection>>,
    acquire: redis::Script,
    release: redis::Script,
    config: RedisConfig,
    metrics: Arc<QuotaMetrics>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend").field("config", &self.config).finish_non_exhaustive()
    }
}

fn unavailable(what: &str, error: impl std::fmt::Display) -> BackendError {
    BackendError::Unavailable(format!("{what} in redis: {error}"))
}

impl RedisBackend {
    /// A backend for `config`; connects on first use.
    ///
    /// # Errors
    ///
    /// [`BackendError::Unavailable`] when the address is not `host:port`.
    pub fn new(config: RedisConfig, metrics: Arc<QuotaMetrics>) -> Result<Self, BackendError> {
        let (host, port) = config
            .addr
            .rsplit_once(':')
            .and_then(|(h, p)| {
                Some((h.trim_matches(['[', ']']).to_owned(), p.parse::<u16>().ok()?))
            })
            .ok_or_else(|| {
                unavailable("parse address", format!("{:?} is not host:port", config.addr))
            })?;
        let info = (host, port).into_connection_info().map_err(|e| unavailable("configure", e))?;
        let mut settings = info.redis_settings().clone().set_db(config.db);
        if let Some(user) = &config.username {
            settings = settings.set_username(user);
        }
        if let Some(password) = &config.password {
            settings = settings.set_password(password);
        }
        let client = redis::Client::open(info.set_redis_settings(settings))
            .map_err(|e| unavailable("configure", e))?;
        Ok(Self {
            client,
            connection: Mutex::new(None),
            acquire: redis::Script::new(&acquire_script()),
            release: redis::Script::new(&release_script()),
            config,
            metrics,
        })
    }

    /// Its settings.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    async fn connection(&self) -> Result<MultiplexedConnection, redis::RedisError> {
        if let Some(connection) =
            self.connection.lock().unwrap_or_else(PoisonError::into_inner).clone()
        {
            return Ok(connection);
        }
        let connection = self.client.get_multiplexed_async_connection().await?;
        debug!(addr = %self.config.addr, "quota: connected to redis");
        *self.connection.lock().unwrap_or_else(PoisonError::into_inner) = Some(connection.clone());
        Ok(connection)
    }

    fn forget_connection(&self) {
        self.connection.lock().unwrap_or_else(PoisonError::into_inner).take();
    }

    /// Runs `call` on the connection within `timeout`; a transport error or the timeout drops
    /// the connection.
    async fn run<T>(
        &self,
        what: &str,
        timeout: Duration,
        call: impl AsyncFnOnce(MultiplexedConnection) -> Result<T, redis::RedisError>,
    ) -> Result<T, BackendError> {
        let attempt = async {
            let connection = self.connection().await?;
            call(connection).await
        };
        match tokio::time::timeout(timeout, attempt).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => {
                if error.is_io_error()
                    || error.is_connection_dropped()
                    || error.is_connection_refusal()
                    || error.is_unrecoverable_error()
                    || error.is_timeout()
                {
                    self.forget_connection();
                }
                Err(unavailable(what, error))
            }
            Err(_) => {
                self.forget_connection();
                Err(unavailable(what, format!("timed out after {timeout:?}")))
            }
        }
    }
}

impl QuotaBackend for RedisBackend {
    fn acquire<'a>(&'a self, params: &'a AcquireParams) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            let timeout = if params.enforce {
                self.config.operation_timeout
            } else {
                self.config.maintenance_timeout
            };
            let entry = params.entry.to_json();
            let limits = limits_json(params.limits.as_ref());
            let flag = if params.enforce { "1" } else { "0" };
            let reply: String = self
                .run("acquire quota", timeout, async |mut connection| {
                    let mut invocation = self.acquire.prepare_invoke();
                    for key in keys(&params.user) {
                        invocation.key(key);
                    }
                    invocation.arg(&params.lock).arg(&entry).arg(flag).arg(&limits);
                    invocation.invoke_async(&mut connection).await
                })
                .await?;
            match reply.as_str() {
                "OK" => Ok(()),
                "REJECTED" => Err(BackendError::Exceeded),
                other => Err(unavailable("acquire quota", format!("unexpected result {other:?}"))),
            }
        })
    }

    fn release<'a>(
        &'a self,
        user: &'a str,
        lock: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            let reply: String = self
                .run("release quota", self.config.maintenance_timeout, async |mut connection| {
                    let mut invocation = self.release.prepare_invoke();
                    for key in keys(user) {
                        invocation.key(key);
                    }
                    invocation.arg(lock);
                    invocation.invoke_async(&mut connection).await
                })
                .await?;
            match reply.as_str() {
                "OK" => Ok(()),
                other => Err(unavailable("release quota", format!("unexpected result {other:?}"))),
            }
        })
    }

    fn list_entries<'a>(
        &'a self,
        user: &'a str,
    ) -> BoxFuture<'a, Result<HashMap<String, Entry>, BackendError>> {
        Box::pin(async move {
            let raw: HashMap<String, String> = self
                .run("list quota entries", self.config.maintenance_timeout, async |mut c| {
                    c.hgetall(live_key(user)).await
                })
                .await?;
            // An entry that does not decode is skipped and counted, as the reference does.
            let mut entries = HashMap::with_capacity(raw.len());
            for (lock, json) in raw {
                match Entry::from_json(&json) {
                    Ok(entry) => {
                        entries.insert(lock, entry);
                    }
                    Err(_) => self.metrics.backend_error("list_entries_decode"),
                }
            }
            Ok(entries)
        })
    }

    fn cleanup<'a>(&'a self, user: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            let keys = keys(user);
            self.run("cleanup quota keys", self.config.maintenance_timeout, async |mut c| {
                c.del::<_, i64>(&keys).await
            })
            .await
            .map(drop)
        })
    }

    fn name(&self) -> &'static str {
        "redis"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_script_tables_are_the_references() {
        assert_eq!(
            keys("k1"),
            [
                "q:live:{k1}".to_owned(),
                "q:sum:{k1}:sandbox.count".to_owned(),
                "q:sum:{k1}:limits.cpu".to_owned(),
                "q:sum:{k1}:limits.memory".to_owned(),
            ]
        );
        assert_eq!(
            dimension_tables(),
            "local dims = {\"sandbox.count\", \"limits.cpu\", \"limits.memory\"}\nlocal keyIndex = {[\"sandbox.count\"] = 2, [\"limits.cpu\"] = 3, [\"limits.memory\"] = 4}"
        );
        assert!(!acquire_script().contains(PLACEHOLDER));
        assert!(!release_script().contains(PLACEHOLDER));
    }

    #[test]
    fn addresses_must_be_host_and_port() {
        let new = |addr: &str| RedisBackend::new(RedisConfig::new(addr), Arc::default());
        assert!(new("127.0.0.1:6379").is_ok());
        assert!(new("[::1]:6379").is_ok());
        assert!(new("localhost").is_err());
    }
}
