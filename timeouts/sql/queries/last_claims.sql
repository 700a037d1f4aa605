-- The last claim of each kind of claimer (sql/migrations/0001_last_claims.sql): written by the
-- claiming path, read by the health check.
-- Parameters use Django's %(name)s style, so a literal percent sign is written %%.


-- name: note_claim
-- Records that a claimer of one kind claimed now, and from which process.
--
-- An autocommit statement of its own, after a round of claims was published. Several processes
-- write the same row: the guard keeps the latest time when two of them cross.
INSERT INTO timeouts_last_claims AS last (claimer, claimed_at, process)
VALUES (%(claimer)s, now(), %(process)s)
ON CONFLICT (claimer) DO UPDATE SET claimed_at = excluded.claimed_at, process = excluded.process
WHERE last.claimed_at < excluded.claimed_at;


-- name: last_claims
-- When each kind of claimer last claimed on this database, and how long ago by its clock.
SELECT claimer, claimed_at, process, now() - claimed_at AS age
FROM timeouts_last_claims
ORDER BY claimed_at DESC;
