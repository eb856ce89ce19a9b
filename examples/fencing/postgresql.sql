-- Fencing a PostgreSQL write with a targetlease fencing token.
--
-- Copy this file into your schema migrations. It keeps, per protected
-- resource, the highest token that has written, and refuses a write that
-- carries a lower one. Run the check and your data write in ONE transaction:
--
--   BEGIN;
--   SELECT targetlease_fence('orders', $1);   -- $1: your fencing token (bigint)
--   UPDATE orders SET ... WHERE ...;          -- your write
--   COMMIT;
--
-- * A lower token raises SQLSTATE 'TLF01' ("stale fencing token"): the
--   transaction is aborted, so your write is not applied. Stop acting on the
--   lease; do not retry with the same token.
-- * An equal token is accepted: one holder may write many times.
-- * A higher token is accepted and becomes the new floor.
-- * targetlease_fence locks the resource's fence row until COMMIT or
--   ROLLBACK, so concurrent writers of one resource are serialized and the
--   check cannot go stale between the call and your write (at the default
--   READ COMMITTED isolation, and at any stricter one).
-- * Tokens are bigint: every token targetlease issues (1 .. 2^63-1) is stored
--   and compared exactly. Pass it as a 64-bit integer parameter, never
--   through a floating-point type (e.g. a JavaScript number).
-- * Checking the token in a separate statement or transaction before the
--   write is not fencing: the lease can be lost between the two.

CREATE TABLE IF NOT EXISTS targetlease_fence (
    resource   text PRIMARY KEY,
    token      bigint NOT NULL CHECK (token > 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION targetlease_fence(p_resource text, p_token bigint)
RETURNS bigint
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_token IS NULL OR p_token < 1 THEN
        RAISE EXCEPTION 'invalid fencing token % for %', p_token, p_resource
            USING ERRCODE = 'TLF02';
    END IF;
    -- Inserts the first token, raises the floor, or (for a lower token)
    -- matches no row. Either way the row stays locked by this transaction.
    INSERT INTO targetlease_fence AS f (resource, token)
    VALUES (p_resource, p_token)
    ON CONFLICT (resource) DO UPDATE
        SET token = EXCLUDED.token, updated_at = now()
        WHERE f.token <= EXCLUDED.token;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'stale fencing token % for %: a newer holder has written', p_token, p_resource
            USING ERRCODE = 'TLF01',
                  HINT = 'the lease was lost; stop writing';
    END IF;
    RETURN p_token;
END;
$$;

-- The same guard as one statement, for a table that carries its own fence
-- column (one row per resource; a fresh row starts at fence = 0):
--
--   UPDATE accounts
--      SET balance = $2, fence = $3
--    WHERE id = $1 AND fence <= $3;
--   -- 0 rows updated => refused: a newer holder has written.
