"""The contracts: JSON Schemas of every Kafka message, the op-type vocabulary and the
ClickHouse DDL as numbered migrations."""
