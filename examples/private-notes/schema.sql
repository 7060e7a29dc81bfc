-- tidepool database schema (SQLite, WAL mode)
CREATE TABLE IF NOT EXISTS readings (
    buoy_id   TEXT    NOT NULL,
    sensor    TEXT    NOT NULL,   -- water_temp | salinity | wave_height | pressure
    ts        INTEGER NOT NULL,   -- epoch seconds, UTC
    value     REAL    NOT NULL,   -- canonical unit, see ADR 0003
    unit      TEXT    NOT NULL,
    flag      TEXT    NOT NULL DEFAULT 'ok',  -- ok | suspect | stale
    PRIMARY KEY (buoy_id, sensor, ts)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS readings_ts ON readings (ts);
