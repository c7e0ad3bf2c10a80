-- Scenario predictions (docs/scenarios.md): one row per scenario of a
-- `rankwatch scenario ... --store` run; a run's rows share run_id and time.
CREATE TABLE IF NOT EXISTS scenarios
(
    job LowCardinality(String),
    time DateTime64(3, 'UTC') COMMENT 'when the run computed it',
    run_id String COMMENT 'one id per run',
    position UInt16 COMMENT 'order in the run (the baseline first when there is one)',
    name String,
    settings String COMMENT 'JSON object of the changed settings',
    swept_key LowCardinality(String) COMMENT 'the --sweep key; empty when none',
    swept_value Nullable(Float64) COMMENT 'the swept value when a number',
    step_time_s Float64 COMMENT 'simulated step time, mean over the steps',
    baseline_s Float64 COMMENT 'the job as measured, simulated, s',
    speedup Float64 COMMENT 'baseline_s / step_time_s',
    steps UInt32 COMMENT 'steps calibrated on',
    last_step UInt64 COMMENT 'newest step calibrated on'
)
ENGINE = ReplacingMergeTree
ORDER BY (job, time, run_id, position)
TTL toDateTime(time) + INTERVAL 90 DAY
;
