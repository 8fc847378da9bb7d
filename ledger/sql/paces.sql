-- name: pace_turn_take
-- Reserves the next turn of downstream %(name)s: its start is the latest of now, the row's next turn and its
-- 429 hold, and the next turn moves %(interval)s seconds past it. Returns the seconds to wait for the start,
-- or no row when that start is more than %(max_wait)s seconds away (nothing reserved: a refused call must not
-- push the next one's turn further off).
INSERT INTO downstream_paces AS p (name, next_at, held_until)
VALUES (%(name)s, statement_timestamp() + make_interval(secs => %(interval)s), '-infinity')
ON CONFLICT (name) DO UPDATE
   SET next_at = greatest(p.next_at, p.held_until, statement_timestamp()) + make_interval(secs => %(interval)s)
 WHERE greatest(p.next_at, p.held_until, statement_timestamp())
       <= statement_timestamp() + make_interval(secs => %(max_wait)s)
RETURNING extract(epoch FROM p.next_at - statement_timestamp())::float8 - %(interval)s AS wait;

-- name: pace_turn_wait
-- How many seconds away the next turn of downstream %(name)s is (0 when it is free now): a refused call's
-- retry_after.
SELECT extract(epoch FROM greatest(next_at, held_until, statement_timestamp()) - statement_timestamp())::float8
       AS wait
FROM downstream_paces WHERE name = %(name)s;

-- name: pace_hold_set
-- A 429 from downstream %(name)s: no call of it starts sooner than %(seconds)s seconds from now, a longer hold
-- already set never shortened.
INSERT INTO downstream_paces AS p (name, next_at, held_until)
VALUES (%(name)s, '-infinity', statement_timestamp() + make_interval(secs => %(seconds)s))
ON CONFLICT (name) DO UPDATE SET held_until = greatest(p.held_until, EXCLUDED.held_until);

-- name: pace_hold_left
-- Seconds left of downstream %(name)s's 429 hold (0 when none): a call that waited for its turn looks again
-- before it is sent, since a hold set meanwhile voids the turn.
SELECT extract(epoch FROM greatest(held_until, statement_timestamp()) - statement_timestamp())::float8 AS held
FROM downstream_paces WHERE name = %(name)s;
