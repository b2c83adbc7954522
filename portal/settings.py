"""Settings, twelve-factor style: every knob is an environment variable with a safe default.

With no environment at all Ringmaster runs embedded: SQLite, the local runner, a Celery broker on
the filesystem and an in-memory channel layer. DATABASE_URL and REDIS_URL switch to PostgreSQL and
Redis. See README.md "Configuration" for the full list.
"""
import base64
import importlib.util
import os
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name, default=False):
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name, default=""):
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


# Where Ringmaster keeps its own files: the SQLite database, job working directories, the
# embedded broker's queue. Never inside a job's reach through the web.
DATA_DIR = Path(os.environ.get("RINGMASTER_DATA_DIR", BASE_DIR / "var")).resolve()
DATA_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)


def _private(folder):
    """`folder` (the data folder: the database, its secrets, every job's files) open to the
    portal's own account only, whatever the umask or an older installation made it."""
    if folder.stat().st_uid == os.geteuid() and folder.stat().st_mode & 0o077:
        folder.chmod(0o700)


_private(DATA_DIR)


def _kept(name, make):
    """A secret generated once and kept in DATA_DIR (mode 0600). Web, worker and beat start at
    once: the file appears whole (written aside, then linked) and the first one made wins."""
    path = DATA_DIR / name
    if not path.exists():
        aside = DATA_DIR / f".{name}.{os.getpid()}"
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(make() + "\n")
        try:
            os.link(aside, path)
        except FileExistsError:
            pass
        finally:
            aside.unlink()
    return path.read_text().strip()


# The embedded default (no DATABASE_URL) keeps the secrets it needs in DATA_DIR; a deployment
# sets them (the system check jobs.checks refuses to start without RINGMASTER_FERNET_KEYS).
EMBEDDED = not os.environ.get("DATABASE_URL")
SECRET_KEY = os.environ.get("SECRET_KEY") or _kept("secret_key", lambda: secrets.token_urlsafe(50))
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "frontend",                       # first: its admin/base_site.html (the site's warnings) is the admin's
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",        # Swagger UI's files, served from here (no CDN)
    "csp",
    "channels",
    "jobs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "portal.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
ASGI_APPLICATION = "portal.asgi.application"
WSGI_APPLICATION = "portal.wsgi.application"

# --- database -------------------------------------------------------------------------------
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{DATA_DIR / 'ringmaster.sqlite3'}"),
        # Kept open for a minute: a websocket viewer's query should not pay for a new connection.
        conn_max_age=int(os.environ.get("DATABASE_CONN_MAX_AGE", "60")),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The database file made 0600 before SQLite opens it (its -wal and -shm files take its mode):
    # it holds sessions and password hashes.
    _database = Path(str(DATABASES["default"]["NAME"]))
    if str(_database) not in ("", ":memory:") and not str(_database).startswith("file:") \
            and _database.parent.is_dir():
        os.close(os.open(_database, os.O_WRONLY | os.O_CREAT, 0o600))
        for _file in (_database, Path(f"{_database}-wal"), Path(f"{_database}-shm")):
            if _file.exists() and _file.stat().st_uid == os.geteuid() and _file.stat().st_mode & 0o077:
                _file.chmod(0o600)
    # Web, worker and beat write concurrently: take the write lock at BEGIN and wait for it.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: Celery broker and channel layer -------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
    CHANNEL_LAYERS = {
        "default": {
            # Pub/sub: a group message (a push that carries a batch of lines) goes to Redis once
            # and reaches each web process once, whatever the number of viewers; a message no
            # process hears is gone, which viewers survive (they catch up from the database).
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            # RESP2: with redis-py's default, RESP3, each message is made into a string for a
            # debug log that is then dropped (redis/redis-py#4230), a sixth of a web process's CPU.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 10, "protocol": 2}]},
        }
    }
else:
    # Embedded: a broker that is a pair of folders, and live updates inside one process.
    CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "filesystem://")
    _queue_dir = DATA_DIR / "broker"
    (_queue_dir / "queue").mkdir(parents=True, exist_ok=True)
    (_queue_dir / "processed").mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir / "queue"),
        "data_folder_out": str(_queue_dir / "queue"),
        "processed_folder": str(_queue_dir / "processed"),
        "control_folder": str(_queue_dir / "control"),   # else ./control, beside the code
        "store_processed": False,
    }
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("RINGMASTER_QUEUE", "ringmaster")
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE = {
    "reconcile": {"task": "jobs.tasks.reconcile", "schedule": 15.0},
    # Jobs that waited long or whose GPUs sit idle, announced to their owners (jobs.domain.notifications).
    "notifications": {"task": "jobs.tasks.check_notifications", "schedule": 60.0},
    # Artifacts past RINGMASTER_ARTIFACT_RETENTION_DAYS deleted (jobs.domain.artifacts.expire).
    "artifact-retention": {"task": "jobs.tasks.expire_artifacts", "schedule": 3600.0},
    # Running jobs' TensorBoard scalars read into metric points (jobs.domain.tbmetrics).
    "tensorboard": {"task": "jobs.tasks.scrape_tensorboard",
                    "schedule": float(os.environ.get("RINGMASTER_TENSORBOARD_SECONDS", "5"))},
    # Running studies: new metric points reported to Optuna (pruning), ended trials told, new ones
    # asked (jobs.domain.studies); a trial's job that ends also starts a pass at once.
    "studies": {"task": "jobs.tasks.drive_studies",
                "schedule": float(os.environ.get("RINGMASTER_STUDY_SECONDS", "5"))},
}
# Beat adds the enabled backends' health checks, each at its own interval (portal.celery).

# --- auth and API ---------------------------------------------------------------------------
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "job-list"
LOGOUT_REDIRECT_URL = "login"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Token first, so an anonymous API call gets 401 with WWW-Authenticate: Token.
        "jobs.web.signin.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["jobs.web.parsers.JSONParser", "rest_framework.parsers.FormParser",
                               "rest_framework.parsers.MultiPartParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "jobs.web.params.Pagination",   # a bad ?limit= or ?offset= is a 400
    "PAGE_SIZE": 50,
}
# --- sign-in throttling (django-axes; jobs.web.signin) --------------------------------------
# The failed sign-ins (passwords on /login/ and /admin/login/, API tokens) an account, or an
# address, may make within the window; the next is refused until the window has passed since the
# last failure. Failures while refused do not count.
RINGMASTER_SIGNIN_FAILURES = int(os.environ.get("RINGMASTER_SIGNIN_FAILURES", "5"))
RINGMASTER_SIGNIN_LOCKOUT_SECONDS = float(os.environ.get("RINGMASTER_SIGNIN_LOCKOUT_SECONDS", "900"))
INSTALLED_APPS += ["axes"]
MIDDLEWARE += ["axes.middleware.AxesMiddleware"]          # last: it turns a refusal into the page
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = RINGMASTER_SIGNIN_FAILURES + 1
AXES_COOLOFF_TIME = timedelta(seconds=RINGMASTER_SIGNIN_LOCKOUT_SECONDS)
AXES_LOCKOUT_PARAMETERS = "jobs.web.signin.lockout_parameters"
AXES_LOCKOUT_CALLABLE = "jobs.web.signin.lockout_response"
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_VERBOSE = False

# --- single sign-on (django-allauth; jobs.web.sso, jobs.domain.directory) ------------------
# An OpenID Connect provider from the environment: RINGMASTER_OIDC_ISSUER (its discovery document
# at <issuer>/.well-known/openid-configuration), the client's id and secret, the button's label.
# More providers (SAML, other OIDC ones) are added in the admin (Social applications). Users are
# matched on the provider's subject, never on e-mail: a new subject whose e-mail an account
# already has becomes an account of its own. Local accounts sign in as before on /login/.
RINGMASTER_OIDC_ISSUER = os.environ.get("RINGMASTER_OIDC_ISSUER", "").strip().rstrip("/")
RINGMASTER_OIDC_CLIENT_ID = os.environ.get("RINGMASTER_OIDC_CLIENT_ID", "")
RINGMASTER_OIDC_CLIENT_SECRET = os.environ.get("RINGMASTER_OIDC_CLIENT_SECRET", "")
RINGMASTER_OIDC_NAME = os.environ.get("RINGMASTER_OIDC_NAME", "") or "single sign-on"
# The claim whose values are the user's groups, set at every sign-on (jobs.domain.directory), and
# the value of it that makes the user staff.
RINGMASTER_OIDC_GROUPS_CLAIM = os.environ.get("RINGMASTER_OIDC_GROUPS_CLAIM", "") or "groups"
RINGMASTER_OIDC_STAFF_GROUP = os.environ.get("RINGMASTER_OIDC_STAFF_GROUP", "")
INSTALLED_APPS += ["allauth", "allauth.account", "allauth.socialaccount",
                   "allauth.socialaccount.providers.openid_connect"]
MIDDLEWARE.insert(MIDDLEWARE.index("axes.middleware.AxesMiddleware"), "allauth.account.middleware.AccountMiddleware")
ACCOUNT_ADAPTER = "jobs.web.sso.AccountAdapter"            # no sign-up but through a provider
SOCIALACCOUNT_ADAPTER = "jobs.web.sso.SocialAccountAdapter"
ACCOUNT_EMAIL_VERIFICATION = "none"            # the provider vouches for its users
ACCOUNT_UNIQUE_EMAIL = False                   # so a new subject never stalls on an e-mail in use
SOCIALACCOUNT_AUTO_SIGNUP = True
SOCIALACCOUNT_EMAIL_VERIFICATION = "none"
SOCIALACCOUNT_EMAIL_AUTHENTICATION = False     # never sign in to an account by its e-mail alone
SOCIALACCOUNT_EMAIL_AUTHENTICATION_AUTO_CONNECT = False
SOCIALACCOUNT_STORE_TOKENS = False


def oidc_providers(issuer, client_id, secret, name):
    """allauth's providers for one OpenID Connect issuer (none where `issuer` is empty): the
    authorization code flow with PKCE, the endpoints from the issuer's discovery document."""
    return {
        "openid_connect": {
            "OAUTH_PKCE_ENABLED": True,
            "APPS": [{
                "provider_id": "sso",          # part of the callback URL and of each account's key: keep it
                "name": name,
                "client_id": client_id,
                "secret": secret,
                "settings": {"server_url": issuer},
            }] if issuer else [],
        },
    }


SOCIALACCOUNT_PROVIDERS = oidc_providers(RINGMASTER_OIDC_ISSUER, RINGMASTER_OIDC_CLIENT_ID,
                                         RINGMASTER_OIDC_CLIENT_SECRET, RINGMASTER_OIDC_NAME)

# API tokens (jobs.domain.tokens) stop working this many days after they are made (0: never);
# `manage.py create_api_token --expires-days N` makes one of another lifetime.
RINGMASTER_API_TOKEN_DAYS = int(os.environ.get("RINGMASTER_API_TOKEN_DAYS", "90"))

SPECTACULAR_SETTINGS = {
    "TITLE": "Ringmaster API",
    "DESCRIPTION": "Submit and follow distributed Horovod training jobs.",
    "VERSION": "1",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Two choice sets named "state": a job's, and a study's.
    "ENUM_NAME_OVERRIDES": {"JobStateEnum": "jobs.models.State", "StudyStateEnum": "jobs.models.Study.State"},
}

SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
# RINGMASTER_HTTPS: users reach the portal only over HTTPS, directly or through a proxy that ends
# TLS and says so in X-Forwarded-Proto. Browsers are then told to come back only over HTTPS
# (HSTS, a year), cookies travel only over HTTPS, and a request the proxy marks https is secure
# (HSTS is sent on it; the websocket's Origin check expects https://).
# SECURE_COOKIES=true, the setting's earlier name, says the same.
HTTPS = env_bool("RINGMASTER_HTTPS", env_bool("SECURE_COOKIES", False))
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = HTTPS
SECURE_HSTS_SECONDS = 365 * 24 * 3600 if HTTPS else 0
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if HTTPS else None

# Content-Security-Policy (django-csp): scripts, styles, images and connections of the portal's
# own origin only, and no inline script or style. The pages' scripts are static files; what a
# template hands them is JSON in <script type="application/json"> (json_script), which no browser
# runs. The API docs page alone takes inline styles (Swagger UI's page: portal.urls).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],          # the API and the job websocket (ws:/wss: of this origin)
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],        # the login page adds its providers' (jobs.web.sso)
        "frame-ancestors": ["'none'"],
    }
}

# --- static files ---------------------------------------------------------------------------
STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"

LANGUAGE_CODE = "en-us"
TIME_ZONE = os.environ.get("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

# --- Ringmaster -----------------------------------------------------------------------------
# A site-wide cap on the GPUs of one job; unset: none beyond what each backend can ever hold
# (this machine's GPUs or slots, the instances' total, a cluster's GPU limit).
RINGMASTER_MAX_GPUS_PER_JOB = (int(os.environ["RINGMASTER_MAX_GPUS_PER_JOB"])
                               if os.environ.get("RINGMASTER_MAX_GPUS_PER_JOB") else None)
# The local runner's capacity. On a machine without GPUs each "GPU" is one CPU process.
# This machine's capacity: the GPUs nvidia-smi shows (each job owns some, by index), else CPU
# slots. RINGMASTER_LOCAL_GPUS, when set, overrides the count (0: the local backend is off).
RINGMASTER_LOCAL_GPUS = int(os.environ["RINGMASTER_LOCAL_GPUS"]) if os.environ.get("RINGMASTER_LOCAL_GPUS") else None
RINGMASTER_LOCAL_CPU_SLOTS = int(os.environ.get("RINGMASTER_LOCAL_CPU_SLOTS", "8"))
RINGMASTER_NVIDIA_SMI = os.environ.get("RINGMASTER_NVIDIA_SMI", "nvidia-smi")
# How long a process trusts what nvidia-smi last said about this machine's GPUs.
RINGMASTER_GPU_CHECK_SECONDS = float(os.environ.get("RINGMASTER_GPU_CHECK_SECONDS", "30"))
# How often a running job's hosts are sampled (GPU utilization, memory, power; or CPU and memory).
RINGMASTER_TELEMETRY_SECONDS = float(os.environ.get("RINGMASTER_TELEMETRY_SECONDS", "5"))
# Default and largest time limit of a job, in minutes.
RINGMASTER_DEFAULT_TIME_LIMIT_MINUTES = int(os.environ.get("RINGMASTER_DEFAULT_TIME_LIMIT_MINUTES", "1440"))
RINGMASTER_MAX_TIME_LIMIT_MINUTES = int(os.environ.get("RINGMASTER_MAX_TIME_LIMIT_MINUTES", "10080"))
# Recovery (jobs.domain.recovery): the most restarts a job may ask for, and how long a job whose
# attempt failed waits before it is admitted again.
RINGMASTER_MAX_RESTARTS_CAP = int(os.environ.get("RINGMASTER_MAX_RESTARTS_CAP", "10"))
RINGMASTER_RESTART_BACKOFF_SECONDS = float(os.environ.get("RINGMASTER_RESTART_BACKOFF_SECONDS", "30"))
# Where the local runner puts job working directories.
RINGMASTER_JOBS_DIR = Path(os.environ.get("RINGMASTER_JOBS_DIR", DATA_DIR / "jobs")).resolve()
# Where the portal keeps artifacts it brings back from instances (a folder per job, named by the
# installation's id and the job's: jobs.backends.base.Backend.artifacts_root); no job sees it.
RINGMASTER_ARTIFACTS_DIR = Path(os.environ.get("RINGMASTER_ARTIFACTS_DIR", DATA_DIR / "artifacts")).resolve()
# Projects (runners.projects): the largest archive a user may upload, the bytes its files may
# expand to, and how many files it may hold. Each snapshot is kept in the database.
RINGMASTER_PROJECT_MAX_ARCHIVE_MB = float(os.environ.get("RINGMASTER_PROJECT_MAX_ARCHIVE_MB", "50"))
RINGMASTER_PROJECT_MAX_EXPANDED_MB = float(os.environ.get("RINGMASTER_PROJECT_MAX_EXPANDED_MB", "200"))
RINGMASTER_PROJECT_MAX_FILES = int(os.environ.get("RINGMASTER_PROJECT_MAX_FILES", "5000"))
# Extra packages of projects (runners.packages): the environments kept by hash of image and
# requirements, where jobs on this machine read them (hidden from every other job); the network of
# the sandbox a local install runs in (runners.sandbox.NETWORKS; pip reaches the index through it:
# "outbound" where the portal runs as root, as for jobs); the index pip asks (its PIP_INDEX_URL,
# e.g. a mirror; empty: pip's own configuration, /etc/pip.conf or PyPI).
RINGMASTER_ENVS_DIR = Path(os.environ.get("RINGMASTER_ENVS_DIR", DATA_DIR / "envs")).resolve()
RINGMASTER_INSTALL_NETWORK = os.environ.get("RINGMASTER_INSTALL_NETWORK", "outbound" if os.geteuid() == 0 else "none")
RINGMASTER_PIP_INDEX_URL = os.environ.get("RINGMASTER_PIP_INDEX_URL", "")
# Projects from git (runners.gitfetch), fetched by the portal at submit: the URL schemes taken
# (comma separated; http and git are for a trusted network only), the seconds a fetch may take,
# the address ranges a repository may be at although they are private, loopback, link-local or
# this machine's (admins may add more in the admin: networks allowed for git repositories), and
# the ssh host keys an ssh:// repository's host must match (ssh's known_hosts format).
RINGMASTER_GIT_SCHEMES = env_list("RINGMASTER_GIT_SCHEMES", "https,ssh")
RINGMASTER_GIT_TIMEOUT_SECONDS = float(os.environ.get("RINGMASTER_GIT_TIMEOUT_SECONDS", "60"))
RINGMASTER_GIT_ALLOWED_NETWORKS = env_list("RINGMASTER_GIT_ALLOWED_NETWORKS")
RINGMASTER_GIT_SSH_KNOWN_HOSTS = os.environ.get("RINGMASTER_GIT_SSH_KNOWN_HOSTS", "/etc/ssh/ssh_known_hosts")
# Artifacts of jobs that ended longer ago than this are deleted by beat (jobs.tasks.expire_artifacts).
RINGMASTER_ARTIFACT_RETENTION_DAYS = float(os.environ.get("RINGMASTER_ARTIFACT_RETENTION_DAYS", "30"))
# Local jobs run in a bubblewrap sandbox: "auto" where bwrap is installed, "bwrap" always (an error
# at launch without it), "none" never (jobs can then read the portal's secrets).
RINGMASTER_LOCAL_SANDBOX = os.environ.get("RINGMASTER_LOCAL_SANDBOX", "auto")
# The network of a sandboxed local job (runners.sandbox.NETWORKS): "none" (its own loopback only),
# "outbound" (its own namespace with NAT to the outside through pasta; none of this machine's
# addresses; the default where the portal runs as root, which it needs), "host" (the machine's
# network, the portal's services included: a warning).
RINGMASTER_JOB_NETWORK = os.environ.get("RINGMASTER_JOB_NETWORK", "outbound" if os.geteuid() == 0 else "none")
# What the kernel lets one job use on each of its hosts (runners.limits), unless its image says
# otherwise: its processes and threads together (a fork bomb stops there; 4096 is far above what
# a training job's ranks, data loader workers and their threads reach), and its memory in MiB
# (unset: none; the memory a job needs differs too much from one kind of job to the next for one
# number to fit all, so a site sets it, or its images do). 0: no limit.
RINGMASTER_JOB_MAX_PROCESSES = int(os.environ.get("RINGMASTER_JOB_MAX_PROCESSES") or 4096) or None
RINGMASTER_JOB_MEMORY_MIB = int(os.environ.get("RINGMASTER_JOB_MEMORY_MIB") or 0) or None
# A follower that has not reported for this long is presumed dead; reconcile re-attaches.
RINGMASTER_FOLLOWER_STALE_SECONDS = int(os.environ.get("RINGMASTER_FOLLOWER_STALE_SECONDS", "20"))
# Threads of a worker process's follow hub that run what followed jobs' news asks (storing lines,
# recording states, a cancel): however many jobs the process follows (jobs.domain.followhub).
RINGMASTER_FOLLOW_THREADS = int(os.environ.get("RINGMASTER_FOLLOW_THREADS", "16"))
# The database connections a worker process's followers share, however many jobs it follows.
RINGMASTER_FOLLOWER_DB_CONNECTIONS = int(os.environ.get("RINGMASTER_FOLLOWER_DB_CONNECTIONS", "8"))
# A job stuck in LAUNCHING this long fails.
RINGMASTER_LAUNCH_TIMEOUT_SECONDS = int(os.environ.get("RINGMASTER_LAUNCH_TIMEOUT_SECONDS", "300"))
# An elastic job is resized only once it has run this long: Horovod's driver drops a change of
# hosts it sees before rank 0 is ready for it (it logs "no coordinator client, skipping
# notifications" and never sends it again), so the ranks must be up first.
RINGMASTER_ELASTIC_SETTLE_SECONDS = float(os.environ.get("RINGMASTER_ELASTIC_SETTLE_SECONDS", "30"))
# Fernet keys (comma separated, the first encrypts) for secrets stored in the database: the SSH
# private keys of instances and kubeconfigs (jobs.secrets). Embedded: one kept in DATA_DIR.
RINGMASTER_FERNET_KEYS = os.environ.get("RINGMASTER_FERNET_KEYS") or (
    _kept("fernet_key", lambda: base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()) if EMBEDDED else "")
# horovodrun --start-timeout on GPU instances, and how long the portal waits for an instance's
# SSH server before it calls it unreachable.
RINGMASTER_INSTANCE_START_TIMEOUT_SECONDS = int(os.environ.get("RINGMASTER_INSTANCE_START_TIMEOUT_SECONDS", "60"))
# The backend of a job that names none: local, instances or kubernetes.
RINGMASTER_DEFAULT_BACKEND = os.environ.get("RINGMASTER_DEFAULT_BACKEND", "local")
# This portal's id in the names it gives outside its database (job folders, MPIJobs, labels).
# Unset: one made at random with the database and kept there (jobs.models.Installation).
RINGMASTER_INSTALLATION_ID = os.environ.get("RINGMASTER_INSTALLATION_ID", "")
# The enabled backends, by dotted path (jobs.backends.base.Backend subclasses): a job's `backend`
# is one of their names. Space- or comma-separated in the environment; a value that starts with
# "+" adds its paths to the default three.
DEFAULT_BACKENDS = ["jobs.backends.local.LocalBackend", "jobs.backends.instances.backend.InstancesBackend",
                    "jobs.backends.kubernetes.backend.KubernetesBackend"]


def enabled_backends(value):
    """The backends' dotted paths that RINGMASTER_BACKENDS's `value` names ("" or None: the default)."""
    paths = (value or "").replace(",", " ").split()
    if not paths:
        return list(DEFAULT_BACKENDS)
    if paths[0].startswith("+"):
        added = [paths[0][1:], *paths[1:]]
        return DEFAULT_BACKENDS + [path for path in added if path and path not in DEFAULT_BACKENDS]
    return paths


RINGMASTER_BACKENDS = enabled_backends(os.environ.get("RINGMASTER_BACKENDS"))


def backend_apps(paths):
    """The Django apps among the packages of `paths` (dotted paths of Backend classes): the
    package a backend class is in, when it has an apps.py or a models.py. Such a backend brings
    its own models, migrations, admin.py (found by the admin's autodiscover) and templates, and is
    installed only while it is enabled. Found on disk, importing nothing below the top package
    (a backend module imports models, which need the apps)."""
    apps = []
    for path in paths:
        parts = path.split(".")[:-1]
        try:
            spec = importlib.util.find_spec(parts[0]) if parts and parts[0] else None
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            continue          # jobs.backends' loader reports a path that cannot be imported
        folder = Path(list(spec.submodule_search_locations)[0]).joinpath(*parts[1:])
        package = parts
        if not folder.is_dir():           # a module: its package
            folder, package = folder.parent, parts[:-1]
        name = ".".join(package)
        if any((folder / file).exists() for file in ("apps.py", "models.py")) and name not in apps:
            apps.append(name)
    return apps


INSTALLED_APPS += [app for app in backend_apps(RINGMASTER_BACKENDS) if app not in INSTALLED_APPS]
# The Kubernetes backend: the timeout of one API call, and how often pods and events are polled.
RINGMASTER_KUBE_REQUEST_SECONDS = float(os.environ.get("RINGMASTER_KUBE_REQUEST_SECONDS", "10"))
RINGMASTER_KUBE_POLL_SECONDS = float(os.environ.get("RINGMASTER_KUBE_POLL_SECONDS", "2"))
RINGMASTER_SSH_CONNECT_TIMEOUT_SECONDS = float(os.environ.get("RINGMASTER_SSH_CONNECT_TIMEOUT_SECONDS", "10"))


def env_limit(name):
    """A quota limit from the environment: a number, or unset/empty for no limit."""
    value = os.environ.get(name, "").strip()
    return float(value) if "." in value else (int(value) if value else None)


# Site default quota of every user who has no quota row of their own (jobs.domain.quotas). Unset: no
# limit of that kind. Group quotas exist only where an admin sets them.
RINGMASTER_DEFAULT_QUOTA_GPUS = env_limit("RINGMASTER_DEFAULT_QUOTA_GPUS")
RINGMASTER_DEFAULT_QUOTA_JOBS = env_limit("RINGMASTER_DEFAULT_QUOTA_JOBS")
RINGMASTER_DEFAULT_QUOTA_GPUS_PER_JOB = env_limit("RINGMASTER_DEFAULT_QUOTA_GPUS_PER_JOB")
RINGMASTER_DEFAULT_QUOTA_GPU_HOURS = env_limit("RINGMASTER_DEFAULT_QUOTA_GPU_HOURS")
RINGMASTER_DEFAULT_QUOTA_WINDOW_DAYS = int(os.environ.get("RINGMASTER_DEFAULT_QUOTA_WINDOW_DAYS", "30"))

# --- notifications (jobs.domain.notifications) ----------------------------------------------
# E-mail: SMTP where EMAIL_HOST is set; else the console (the worker's log), as embedded.
EMAIL_HOST = os.environ.get("EMAIL_HOST", "")
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND") or (
    "django.core.mail.backends.smtp.EmailBackend" if EMAIL_HOST else "django.core.mail.backends.console.EmailBackend")
EMAIL_PORT = int(os.environ.get("EMAIL_PORT", "587" if env_bool("EMAIL_USE_TLS") else "25"))
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = int(os.environ.get("EMAIL_TIMEOUT", "20"))
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "ringmaster@localhost")
# Address ranges (comma separated, e.g. "10.20.0.0/16,127.0.0.0/8") that notification targets may
# point at although they are private, loopback, link-local or this machine's; admins may add more
# in the admin (networks allowed for notifications).
RINGMASTER_NOTIFY_ALLOWED_NETWORKS = env_list("RINGMASTER_NOTIFY_ALLOWED_NETWORKS")
# A running job's GPUs are idle while every one of them is below this utilization (%).
RINGMASTER_NOTIFY_IDLE_BELOW_PERCENT = float(os.environ.get("RINGMASTER_NOTIFY_IDLE_BELOW_PERCENT", "10"))
# The portal's address as users reach it, for the links in notifications; unset: links are paths.
RINGMASTER_PUBLIC_URL = os.environ.get("RINGMASTER_PUBLIC_URL", "")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"refusals_in_one_line": {"()": "portal.logfilters.RefusalsInOneLine"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain",
                             "filters": ["refusals_in_one_line"]}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
