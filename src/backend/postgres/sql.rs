//! The SQL of a [`PostgresStore`](super::PostgresStore), built once per
//! schema.
//!
//! Every statement text names the store's schema, so the texts are built
//! when the store connects and kept in [`Sql`]; calls prepare them once
//! per pooled connection (deadpool's statement cache).
//!
//! Writes run inside server-side functions that [`Sql::migrate`] installs,
//! one call per batch of requests, so no lock is ever held while the
//! server waits for calm (see the module docs of
//! [`postgres`](super) for the argument).

/// Every statement a store runs, for one schema.
#[derive(Debug)]
pub(super) struct Sql {
    /// The schema (validated: ASCII letters, digits, `_`).
    pub schema: String,
    /// The `LISTEN`/`NOTIFY` channel.
    pub channel: String,
    /// Creates or upgrades the schema, tables and functions.
    pub migrate: String,
    /// `apply(...)`: one batch of requests (see [`super::batch`]).
    pub apply: String,
    /// The store revision.
    pub revision: String,
    /// One live key.
    pub get: String,
    /// Live keys in `[$1, $2)` (`$2` NULL: no upper bound), at most `$3`,
    /// with the revision of the same snapshot.
    pub range: String,
    /// Grants a lease of `$1` ms.
    pub grant: String,
    /// Renews lease `$1`.
    pub keep_alive: String,
    /// Time left of lease `$1`, in ms.
    pub time_to_live: String,
    /// Ends lease `$1`: true if it was alive.
    pub revoke: String,
    /// Reaps expired leases; returns how many.
    pub reap: String,
    /// Drops events up to `$1`.
    pub compact: String,
    /// The revision and compaction mark, and the events of one watch
    /// read, in one snapshot.
    pub events: String,
    /// Revision and compaction mark.
    pub marks: String,
}

/// The columns of a key, as every statement returns them.
const KV: &str = "k.key, k.value, k.create_revision, k.mod_revision, k.writes, k.lease";

impl Sql {
    /// Builds the statements of `schema`.
    pub(super) fn new(schema: &str) -> Self {
        let s = schema;
        let live = format!(
            "(k.lease IS NULL OR EXISTS (SELECT 1 FROM {s}.leases l \
             WHERE l.id = k.lease AND l.deadline > clock_timestamp()))"
        );
        let channel = format!("calm_{s}");
        Self {
            migrate: migrate(s, &channel),
            apply: format!(
                "SELECT * FROM {s}.apply($1::int[], $2::int[], $3::int[], $4::bytea[], \
                 $5::smallint[], $6::smallint[], $7::bigint[], $8::bytea[], $9::smallint[], \
                 $10::bytea[], $11::bytea[], $12::bigint[])"
            ),
            revision: format!("SELECT revision FROM {s}.meta WHERE id = 1"),
            get: format!("SELECT {KV} FROM {s}.kv k WHERE k.key = $1 AND {live}"),
            range: format!(
                "SELECT m.revision, {KV} FROM {s}.meta m LEFT JOIN LATERAL (
                     SELECT * FROM {s}.kv k
                     WHERE k.key >= $1 AND ($2::bytea IS NULL OR k.key < $2) AND {live}
                     ORDER BY k.key LIMIT $3) k ON true
                 WHERE m.id = 1 ORDER BY k.key"
            ),
            grant: format!(
                "INSERT INTO {s}.leases (ttl_ms, deadline)
                 VALUES ($1, clock_timestamp() + $1::bigint * interval '1 millisecond')
                 RETURNING id"
            ),
            keep_alive: format!(
                "UPDATE {s}.leases SET deadline = clock_timestamp() + ttl_ms * interval '1 millisecond'
                 WHERE id = $1 AND deadline > clock_timestamp() RETURNING ttl_ms"
            ),
            time_to_live: format!(
                "SELECT (extract(epoch FROM deadline - clock_timestamp()) * 1000)::bigint
                 FROM {s}.leases WHERE id = $1 AND deadline > clock_timestamp()"
            ),
            revoke: format!("SELECT {s}.revoke($1)"),
            reap: format!("SELECT {s}.reap()"),
            compact: format!("SELECT {s}.compact($1)"),
            events: format!(
                "SELECT m.revision, c.compacted, e.revision, e.key, e.kind, e.value,
                        e.create_revision, e.writes, e.lease
                 FROM {s}.meta m CROSS JOIN {s}.compaction c
                 LEFT JOIN {s}.events e
                   ON e.revision >= $1 AND e.revision <= least(m.revision, $1 + $2)
                  AND e.revision > c.compacted
                  AND (CASE WHEN $4 THEN e.key >= $3 AND ($5::bytea IS NULL OR e.key < $5)
                            ELSE e.key = $3 END)
                 WHERE m.id = 1 AND c.id = 1
                 ORDER BY e.revision, e.key"
            ),
            marks: format!(
                "SELECT m.revision, c.compacted FROM {s}.meta m, {s}.compaction c
                 WHERE m.id = 1 AND c.id = 1"
            ),
            schema: s.to_string(),
            channel,
        }
    }
}

/// The tables and functions of one store, idempotent, serialised across
/// concurrent callers by an advisory lock.
///
/// Tables:
///
/// - `meta`: one row, the store revision. Its row lock is the store-wide
///   write lock: a write takes it (`SELECT ... FOR UPDATE`), assigns the
///   next revisions, and releases it at commit, so revision order is
///   commit order.
/// - `compaction`: one row, the highest compacted revision (its own row so
///   compacting never waits for writers, or writers for it).
/// - `kv`: the keys; `leases`: id, TTL and deadline by the database clock;
///   `events`: every put and delete by revision, for watches.
///
/// Functions (each runs inside the one statement that calls it, so its
/// locks last only as long as the server takes to run it):
///
/// - `apply`: a batch of requests (compares, then the success or failure
///   branch), each with its own outcome. Requests that only read, or whose
///   compares fail on the current state and whose failure branch only
///   reads, are answered without the store-wide lock.
/// - `reap`, `revoke`: end leases, deleting their keys at a new revision.
/// - `compact`: drops history.
fn migrate(s: &str, channel: &str) -> String {
    format!(
        r#"SELECT pg_advisory_xact_lock(hashtext('calm_migrate'));
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE IF NOT EXISTS {s}.meta (
    id smallint PRIMARY KEY CHECK (id = 1),
    revision bigint NOT NULL);
INSERT INTO {s}.meta VALUES (1, 0) ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS {s}.compaction (
    id smallint PRIMARY KEY CHECK (id = 1),
    compacted bigint NOT NULL);
INSERT INTO {s}.compaction VALUES (1, 0) ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS {s}.kv (
    key bytea PRIMARY KEY,
    value bytea NOT NULL,
    create_revision bigint NOT NULL,
    mod_revision bigint NOT NULL,
    writes bigint NOT NULL,
    lease bigint);
CREATE INDEX IF NOT EXISTS kv_lease ON {s}.kv (lease) WHERE lease IS NOT NULL;
CREATE TABLE IF NOT EXISTS {s}.leases (
    id bigserial PRIMARY KEY,
    ttl_ms bigint NOT NULL,
    deadline timestamptz NOT NULL);
CREATE INDEX IF NOT EXISTS leases_deadline ON {s}.leases (deadline);
CREATE TABLE IF NOT EXISTS {s}.events (
    revision bigint NOT NULL,
    key bytea NOT NULL,
    kind smallint NOT NULL,
    value bytea NOT NULL,
    create_revision bigint NOT NULL,
    writes bigint NOT NULL,
    lease bigint,
    PRIMARY KEY (revision, key));

-- The live row of a key (a key whose lease has ended reads as absent).
-- Volatile, so it reads with a snapshot of its own, taken after any lock
-- its caller waited for.
CREATE OR REPLACE FUNCTION {s}.live(k bytea) RETURNS {s}.kv
LANGUAGE sql VOLATILE AS $$
    SELECT r.* FROM {s}.kv r WHERE r.key = k
      AND (r.lease IS NULL OR EXISTS (SELECT 1 FROM {s}.leases l
           WHERE l.id = r.lease AND l.deadline > clock_timestamp()))
$$;

-- Whether one compare holds for a key's live row (NULL: absent). Targets:
-- 0 create revision, 1 mod revision, 2 writes, 3 value; operators: 0 =,
-- 1 <>, 2 <, 3 >. An absent key reads 0 for numbers; a value compare on
-- an absent key is false.
CREATE OR REPLACE FUNCTION {s}.holds(r {s}.kv, target smallint, op smallint,
                                     num bigint, val bytea) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    field bigint;
BEGIN
    IF target = 3 THEN
        IF r.key IS NULL THEN RETURN false; END IF;
        RETURN CASE op WHEN 0 THEN r.value = val WHEN 1 THEN r.value <> val
                       WHEN 2 THEN r.value < val ELSE r.value > val END;
    END IF;
    field := coalesce(CASE target WHEN 0 THEN r.create_revision
                                  WHEN 1 THEN r.mod_revision ELSE r.writes END, 0);
    RETURN CASE op WHEN 0 THEN field = num WHEN 1 THEN field <> num
                   WHEN 2 THEN field < num ELSE field > num END;
END $$;

-- Deletes lease l and its keys, the keys at revision rev + 1 (if any);
-- returns the revision after it. The caller holds the meta row lock.
CREATE OR REPLACE FUNCTION {s}.end_lease(l bigint, rev bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {s}.leases WHERE id = l;
    IF EXISTS (SELECT 1 FROM {s}.kv WHERE lease = l) THEN
        rev := rev + 1;
        WITH d AS (DELETE FROM {s}.kv WHERE lease = l RETURNING key)
        INSERT INTO {s}.events SELECT rev, d.key, 1, ''::bytea, 0, 0, NULL FROM d;
    END IF;
    RETURN rev;
END $$;

-- Reaps every expired lease, oldest deadline first; returns how many.
-- Takes the store-wide lock only when one has expired.
CREATE OR REPLACE FUNCTION {s}.reap() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    rev bigint; start bigint; l bigint; n integer := 0;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {s}.leases WHERE deadline <= clock_timestamp()) THEN
        RETURN 0;
    END IF;
    SELECT revision INTO rev FROM {s}.meta WHERE id = 1 FOR UPDATE;
    start := rev;
    FOR l IN SELECT id FROM {s}.leases WHERE deadline <= clock_timestamp()
             ORDER BY deadline, id LOOP
        rev := {s}.end_lease(l, rev);
        n := n + 1;
    END LOOP;
    IF rev <> start THEN
        UPDATE {s}.meta SET revision = rev WHERE id = 1;
        PERFORM pg_notify('{channel}', rev::text);
    END IF;
    RETURN n;
END $$;

-- Ends lease l now; false if it had already ended.
CREATE OR REPLACE FUNCTION {s}.revoke(l bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    rev bigint; start bigint; alive boolean;
BEGIN
    SELECT revision INTO rev FROM {s}.meta WHERE id = 1 FOR UPDATE;
    start := rev;
    SELECT deadline > clock_timestamp() INTO alive FROM {s}.leases WHERE id = l;
    IF alive IS NULL THEN RETURN false; END IF;
    rev := {s}.end_lease(l, rev);
    IF rev <> start THEN
        UPDATE {s}.meta SET revision = rev WHERE id = 1;
        PERFORM pg_notify('{channel}', rev::text);
    END IF;
    RETURN alive;
END $$;

-- Drops events up to upto (capped at the current revision).
CREATE OR REPLACE FUNCTION {s}.compact(upto bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    done bigint;
BEGIN
    upto := least(upto, (SELECT revision FROM {s}.meta WHERE id = 1));
    SELECT compacted INTO done FROM {s}.compaction WHERE id = 1 FOR UPDATE;
    IF upto > done THEN
        DELETE FROM {s}.events WHERE revision <= upto;
        UPDATE {s}.compaction SET compacted = upto WHERE id = 1;
    END IF;
END $$;

-- Applies a batch of requests in order. Request i has n_cmp[i] compares
-- (the next ones in the c_* arrays), n_ok[i] success ops and n_else[i]
-- failure ops (the next ones in the o_* arrays; kinds: 0 put, 1 delete,
-- 2 get; lease 0: none). For each request it returns one row with op = -1
-- (succeeded, its revision, err 1 if a put's lease was not alive, with
-- that lease) and one row per op of the branch taken: the key before a
-- put or delete, the key read by a get (present = false: absent).
CREATE OR REPLACE FUNCTION {s}.apply(
    n_cmp int[], n_ok int[], n_else int[],
    c_key bytea[], c_target smallint[], c_op smallint[], c_num bigint[], c_val bytea[],
    o_kind smallint[], o_key bytea[], o_val bytea[], o_lease bigint[])
RETURNS TABLE (req int, op int, succeeded boolean, revision bigint, err smallint,
               present boolean, key bytea, value bytea, create_revision bigint,
               mod_revision bigint, writes bigint, lease bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    rev bigint;          -- the store revision (read, or held under lock)
    start_rev bigint;    -- the revision when the lock was taken
    locked boolean := false;
    ci int := 1;         -- the first compare of the current request
    oi int := 1;         -- the first op of the current request
    ok boolean;
    b int; n int;        -- the branch taken: its first op and length
    writing boolean;
    bumped boolean;
    dead bigint;
    r {s}.kv;
    i int; j int;
BEGIN
    SELECT m.revision INTO rev FROM {s}.meta m WHERE m.id = 1;
    FOR i IN 1 .. coalesce(cardinality(n_cmp), 0) LOOP
        -- Evaluate the compares; without the lock this is a snapshot read,
        -- whose failing outcome is a valid answer at that instant.
        <<evaluate>>
        LOOP
            ok := true;
            FOR j IN ci .. ci + n_cmp[i] - 1 LOOP
                IF NOT {s}.holds({s}.live(c_key[j]), c_target[j], c_op[j], c_num[j], c_val[j])
                THEN ok := false; EXIT; END IF;
            END LOOP;
            IF ok THEN b := oi; n := n_ok[i]; ELSE b := oi + n_ok[i]; n := n_else[i]; END IF;
            writing := false;
            FOR j IN b .. b + n - 1 LOOP
                IF o_kind[j] <> 2 THEN writing := true; EXIT; END IF;
            END LOOP;
            EXIT evaluate WHEN NOT writing OR locked;
            -- A write: take the store-wide lock, then evaluate again on
            -- the state every earlier commit left.
            SELECT m.revision INTO rev FROM {s}.meta m WHERE m.id = 1 FOR UPDATE;
            start_rev := rev;
            locked := true;
        END LOOP;
        IF writing THEN
            -- Keys of ended leases that this request touches are deleted
            -- first, at their own revision, so the history stays exact.
            FOR dead IN
                SELECT l.id FROM {s}.leases l
                WHERE l.deadline <= clock_timestamp() AND l.id IN (
                    SELECT x.lease FROM {s}.kv x
                    WHERE x.key = ANY (c_key[ci : ci + n_cmp[i] - 1])
                       OR x.key = ANY (o_key[oi : oi + n_ok[i] + n_else[i] - 1]))
                ORDER BY l.deadline, l.id
            LOOP
                rev := {s}.end_lease(dead, rev);
            END LOOP;
            -- Every put's lease must be alive, or the request does nothing.
            dead := NULL;
            FOR j IN b .. b + n - 1 LOOP
                IF o_kind[j] = 0 AND o_lease[j] <> 0 AND NOT EXISTS (
                    SELECT 1 FROM {s}.leases l WHERE l.id = o_lease[j]
                    AND l.deadline > clock_timestamp()) THEN
                    dead := o_lease[j]; EXIT;
                END IF;
            END LOOP;
            IF dead IS NOT NULL THEN
                RETURN QUERY SELECT i, -1, ok, rev, 1::smallint, false, NULL::bytea, NULL::bytea,
                                    NULL::bigint, NULL::bigint, NULL::bigint, dead;
                ci := ci + n_cmp[i]; oi := oi + n_ok[i] + n_else[i];
                CONTINUE;
            END IF;
            -- One new revision for the request if it changes anything.
            bumped := false;
            FOR j IN b .. b + n - 1 LOOP
                bumped := o_kind[j] = 0 OR (o_kind[j] = 1 AND EXISTS (
                    SELECT 1 FROM {s}.kv x WHERE x.key = o_key[j]));
                EXIT WHEN bumped;
            END LOOP;
            IF bumped THEN rev := rev + 1; END IF;
        END IF;
        RETURN QUERY SELECT i, -1, ok, rev, 0::smallint, false, NULL::bytea, NULL::bytea,
                            NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint;
        FOR j IN b .. b + n - 1 LOOP
            IF o_kind[j] = 0 THEN
                RETURN QUERY
                WITH prev AS (SELECT * FROM {s}.kv x WHERE x.key = o_key[j]),
                up AS (
                    INSERT INTO {s}.kv AS x VALUES (o_key[j], o_val[j], rev, rev, 1,
                                                   nullif(o_lease[j], 0))
                    ON CONFLICT ON CONSTRAINT kv_pkey DO UPDATE
                    SET value = excluded.value, mod_revision = excluded.mod_revision,
                        writes = x.writes + 1, lease = excluded.lease
                    RETURNING x.key, x.create_revision, x.writes, x.lease),
                ev AS (
                    INSERT INTO {s}.events
                    SELECT rev, up.key, 0, o_val[j], up.create_revision, up.writes, up.lease
                    FROM up)
                SELECT i, j - b, ok, rev, 0::smallint, p.key IS NOT NULL, p.key, p.value,
                       p.create_revision, p.mod_revision, p.writes, p.lease
                FROM (SELECT 1) one LEFT JOIN prev p ON true;
            ELSIF o_kind[j] = 1 THEN
                RETURN QUERY
                WITH d AS (DELETE FROM {s}.kv x WHERE x.key = o_key[j] RETURNING x.*),
                ev AS (INSERT INTO {s}.events
                       SELECT rev, d.key, 1, ''::bytea, 0, 0, NULL FROM d)
                SELECT i, j - b, ok, rev, 0::smallint, d.key IS NOT NULL, d.key, d.value,
                       d.create_revision, d.mod_revision, d.writes, d.lease
                FROM (SELECT 1) one LEFT JOIN d ON true;
            ELSE
                r := {s}.live(o_key[j]);
                RETURN QUERY SELECT i, j - b, ok, rev, 0::smallint, r.key IS NOT NULL, r.key,
                                    r.value, r.create_revision, r.mod_revision, r.writes, r.lease;
            END IF;
        END LOOP;
        ci := ci + n_cmp[i]; oi := oi + n_ok[i] + n_else[i];
    END LOOP;
    IF locked AND rev <> start_rev THEN
        UPDATE {s}.meta m SET revision = rev WHERE m.id = 1;
        PERFORM pg_notify('{channel}', rev::text);
    END IF;
END $$;
"#
    )
}
