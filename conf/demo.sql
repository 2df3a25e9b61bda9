-- Queries `make demo` prints after the pipeline has run. Any SQL over bronze.*, silver.*,
-- gold.* and ops.* works here, Delta time travel included.

-- Top zip codes by person sightings (the hourly nest-camera-stats, summed)
SELECT zip_code, sum(sightings) AS sightings, count(*) AS hours
FROM gold.zip_hourly_sightings WHERE zip_code IS NOT NULL
GROUP BY zip_code ORDER BY sightings DESC LIMIT 5;

-- Busiest hours
SELECT window_start, zip_code, sightings, finalized
FROM gold.zip_hourly_sightings ORDER BY sightings DESC LIMIT 5;

-- Longest device sessions
SELECT device_id, zip_code, session_start, session_end, round(duration_seconds / 60, 1) AS minutes,
       events, person_events, status
FROM gold.device_sessions ORDER BY duration_seconds DESC LIMIT 5;

-- Distinct cameras per zip code per day (exact: each row keeps the set of ids it counts)
SELECT window_start AS day, zip_code, devices, finalized
FROM gold.zip_daily_devices WHERE zip_code IS NOT NULL
ORDER BY devices DESC, day, zip_code LIMIT 5;

-- What bronze read from the landing files or the topic and wrote: every row it reads, byte for
-- byte, so the two sums are equal and equal bronze.events' rows
SELECT query, count(*) AS batches, sum(rows_in) AS rows_read, sum(rows_written) AS rows_written
FROM ops.batch_accounting WHERE layer = 'bronze' GROUP BY query ORDER BY query;

-- Where every bronze record went in silver (summed over all micro-batches)
SELECT query, sum(records_in) AS records_in, sum(events_parsed) AS events_parsed,
       sum(events_written) AS events_written, sum(events_quarantined) AS quarantined,
       sum(duplicates_dropped) AS duplicates, sum(late_dropped) AS late
FROM ops.batch_accounting WHERE layer = 'silver' GROUP BY query ORDER BY query;

-- What gold read from silver and wrote: its units are silver events in and gold rows changed
-- (over all its tables), so it has a statement of its own rather than NULLs in silver's columns
SELECT query, count(*) AS batches, sum(rows_in) AS events_read, sum(late_dropped) AS late,
       sum(rows_written) AS rows_written
FROM ops.batch_accounting WHERE layer = 'gold' GROUP BY query ORDER BY query;
