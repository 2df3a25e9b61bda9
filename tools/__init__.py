"""Tools people run beside the pipeline: status, report, sql, dq-docs, the local Kafka broker
and S3 server, and the process helpers they share. They import common/, never a layer."""
