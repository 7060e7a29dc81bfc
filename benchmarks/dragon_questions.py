"""The questions of the DRAGON network benchmarks (Fig. 6/7, Theorem 6.2): coding requests
about the demo's private project (examples/private-notes, on the device) that also need the
standard library's documentation (the cloud's corpus). The first two are the ones every
earlier result used, so a run with `--questions 2` repeats them."""

from __future__ import annotations

from tandem.serve.dragon_demo import DEFAULT_QUESTION

QUESTIONS = (
    DEFAULT_QUESTION,
    "Write parse_reading(line) for our buoy CSV lines: parse them with csv.reader and turn "
    "the epoch timestamp into an aware datetime with datetime.fromtimestamp in UTC.",
    "Write clean_reading(reading) that drops readings outside our physical bounds and any "
    "value that is not finite, using math.isfinite.",
    "Write to_celsius(buoy_id, value) that converts the Fahrenheit readings of our old "
    "north-basin buoys and leaves the harbour buoys alone, with a doctest.",
    "Write a function that inserts a batch of readings into our SQLite readings table with "
    "sqlite3 executemany, ignoring duplicates on the primary key.",
    "Write is_flatline(values, timestamps) that flags a sensor as suspect when the same value "
    "lasts longer than our flatline_hours, using itertools.groupby.",
    "Write a starlette endpoint for /readings/{buoy_id} that averages readings into the "
    "resolution buckets our API offers, using statistics.fmean.",
    "Write poll_interval(now, stale) for our collector: storm season polls faster, stale "
    "buoys slower; use datetime.date.month.",
    "Write a systemd unit for the tidepool collector that waits for the network as our "
    "debugging log says, and a Python check that reads it with configparser.",
    "Write load_settings(path) that reads our tidepool settings with tomllib and returns a "
    "frozen dataclass, failing clearly on unknown keys.",
    "Write a structlog setup for tidepool that logs JSON lines with the buoy id bound to "
    "every message, following our logging conventions.",
    "Write a pytest test for parse_reading that covers the daylight saving bug from our "
    "debugging log, using zoneinfo.ZoneInfo.",
    "Write backup_database(path, dest) for our SQLite store in WAL mode using "
    "sqlite3.Connection.backup, and say when our backup timer runs it.",
    "Write an aiohttp client fetch_readings(buoy_id, since) for our collector with a timeout "
    "from asyncio.timeout and our retry policy.",
    "Write dedupe(readings) that removes duplicate readings on our de-duplication key, "
    "keeping the first, using a set of tuples.",
    "Write health() for the tidepool API that returns the status JSON our deploy checklist "
    "expects, with json.dumps and http.HTTPStatus.",
)
