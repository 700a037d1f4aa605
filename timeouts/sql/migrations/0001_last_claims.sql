-- When each kind of claimer last claimed on this database: the health check's record that the
-- dispatchers and the scan are at work (manage.py timeouts_health).

-- One row per kind of claimer, written by the claimers (timeouts/store/last_claims.py) at most once
-- a second per process and shard, after a round of claims, whether it claimed tasks or found none
-- it could take: the time says that a claimer is claiming, not that tasks moved. Small and
-- unpartitioned; a row is updated in place, never deleted.
CREATE TABLE timeouts_last_claims (
    claimer    varchar(16)  PRIMARY KEY,
    -- The database clock when that claim ran.
    claimed_at timestamptz  NOT NULL,
    -- Which process claimed last, "host:pid", for the operator who wonders which one is alive.
    process    varchar(255) NOT NULL,
    CONSTRAINT timeouts_last_claims_claimer_valid CHECK (claimer IN ('dispatcher', 'scan'))
);
