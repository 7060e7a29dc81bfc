"""Questions that need both private and public knowledge, with checked answers.

Each question asks for one fact that only the device's private notes hold
(`examples/private-notes`: the tidepool project) and one Python standard-library fact that only
the public corpus holds (the stdlib's docstrings). An answer is *correct* when it contains one
of the private keys and one of the public keys (case-insensitive substring match; keys list the
accepted spellings). `tests/bench/test_private_tasks.py` checks the keys every run: one private
key of each question is in the notes, one public key names the stdlib object `public_name`,
and that object exists in this Python.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    question: str
    private: tuple[str, ...]  # accepted spellings of the private fact
    public: tuple[str, ...]  # accepted spellings of the public fact
    public_name: str  # the stdlib object the public fact names (module.attr), checked to exist


TASKS: tuple[Task, ...] = (
    Task(
        "In tidepool, what base delay does our retry policy start with, and which asyncio "
        "function suspends a coroutine for a number of seconds?",
        ("0.5",),
        ("asyncio.sleep", "sleep("),
        "asyncio.sleep",
    ),
    Task(
        "How many attempts at most does tidepool's retry policy make, and which function of "
        "the random module returns a random float N with a <= N <= b?",
        ("5", "five"),
        ("uniform",),
        "random.uniform",
    ),
    Task(
        "What is the cap of tidepool's retry backoff in seconds, and which function of the "
        "random module returns a float in the interval [0.0, 1.0)?",
        ("20",),
        ("random.random", "random()"),
        "random.random",
    ),
    Task(
        "Where does tidepool keep its SQLite database file, and which sqlite3 function opens "
        "a connection to a database file?",
        ("/var/lib/tidepool/readings.db", "readings.db"),
        ("connect",),
        "sqlite3.connect",
    ),
    Task(
        "Which buoy id prefix marks tidepool's old north-basin buoys, and which str method "
        "tests whether a string begins with a given prefix?",
        ("NB-", "NB"),
        ("startswith",),
        "builtins.str.startswith",
    ),
    Task(
        "In which unit do tidepool's old north-basin buoys report water temperature, and "
        "which function of the math module tests whether a float is NaN?",
        ("fahrenheit",),
        ("isnan",),
        "math.isnan",
    ),
    Task(
        "How often, in seconds, does the tidepool collector poll each buoy outside storm "
        "season, and which asyncio function runs an awaitable with a timeout?",
        ("30",),
        ("wait_for",),
        "asyncio.wait_for",
    ),
    Task(
        "How often, in seconds, does the tidepool collector poll during storm season, and "
        "which method of asyncio.Queue puts an item without blocking?",
        ("15",),
        ("put_nowait",),
        "asyncio.Queue.put_nowait",
    ),
    Task(
        "What maxsize does tidepool give the asyncio.Queue between collector and cleaner, "
        "and which exception does put_nowait raise when that queue is full?",
        ("10_000", "10000", "10,000"),
        ("QueueFull",),
        "asyncio.QueueFull",
    ),
    Task(
        "On which port does the tidepool API listen, and which module of the standard "
        "library opens URLs (the urlopen function)?",
        ("8443",),
        ("urllib.request", "urlopen"),
        "urllib.request.urlopen",
    ),
    Task(
        "For how many seconds does tidepool's API cache its responses, and which functools "
        "decorator caches a function's results with a least-recently-used policy?",
        ("60",),
        ("lru_cache",),
        "functools.lru_cache",
    ),
    Task(
        "After how many hours of the same value does tidepool flag a reading as a flatline, "
        "and which function of the statistics module returns the median of data?",
        ("2 h", "2h", "two hours", "2 hours", "2.0"),
        ("median",),
        "statistics.median",
    ),
    Task(
        "What upper bound in PSU does tidepool's cleaner allow for salinity, and which "
        "function of the math module rounds a float down to an integer?",
        ("42",),
        ("floor",),
        "math.floor",
    ),
    Task(
        "What is the name of the systemd timer that backs up tidepool's database, and which "
        "sqlite3 Connection method makes a backup of a database?",
        ("tidepool-backup.timer", "tidepool-backup"),
        ("backup",),
        "sqlite3.Connection.backup",
    ),
    Task(
        "What connect timeout in seconds does tidepool use for buoy requests, and which "
        "socket function sets the default timeout for new sockets?",
        ("3 s", "3s", "3 seconds", "three"),
        ("setdefaulttimeout",),
        "socket.setdefaulttimeout",
    ),
    Task(
        "Which logging library does tidepool use, and which function of the standard "
        "logging module returns a logger with a given name?",
        ("structlog",),
        ("getLogger",),
        "logging.getLogger",
    ),
    Task(
        "What line length does tidepool's ruff configuration use, and which textwrap "
        "function wraps a paragraph into a list of lines of at most that width?",
        ("100",),
        ("textwrap.wrap", "wrap("),
        "textwrap.wrap",
    ),
    Task(
        "Which class of HTTP status codes does tidepool never retry, and which exception of "
        "urllib.error is raised for HTTP error responses?",
        ("4xx", "400"),
        ("HTTPError",),
        "urllib.error.HTTPError",
    ),
    Task(
        "In which unit does tidepool store pressure readings, and which function of the "
        "bisect module returns the leftmost insertion point for a value in a sorted list?",
        ("hPa", "hectopascal"),
        ("bisect_left",),
        "bisect.bisect_left",
    ),
    Task(
        "How does tidepool store timestamps in its database, and which datetime method "
        "returns the POSIX timestamp of an aware datetime?",
        ("epoch",),
        ("timestamp()", ".timestamp"),
        "datetime.datetime.timestamp",
    ),
    Task(
        "Who suggested DuckDB for tidepool's analytics, and which function of the csv module "
        "returns a reader object that iterates over lines of a CSV file?",
        ("Jonas",),
        ("csv.reader", "reader("),
        "csv.reader",
    ),
    Task(
        "Which path does tidepool's health check endpoint have, and which json function "
        "serializes an object to a JSON formatted str?",
        ("/health",),
        ("dumps",),
        "json.dumps",
    ),
    Task(
        "On which single machine does tidepool run, and which function of the shutil module "
        "returns disk usage statistics for a path?",
        ("raspberry pi", "pi 5"),
        ("disk_usage",),
        "shutil.disk_usage",
    ),
    Task(
        "Which wave height range in metres does tidepool's cleaner accept, and which "
        "built-in function returns the smallest of its arguments?",
        ("0..20", "0 to 20", "20 m", "0-20"),
        ("min(",),
        "builtins.min",
    ),
)


@dataclass(frozen=True)
class Score:
    private: bool
    public: bool

    @property
    def correct(self) -> bool:
        return self.private and self.public


def score(task: Task, answer: str) -> Score:
    text = answer.lower()
    return Score(
        private=any(key.lower() in text for key in task.private),
        public=any(key.lower() in text for key in task.public),
    )
