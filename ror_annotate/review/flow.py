"""The newcomer's review path in two calls: :func:`review_start` and :func:`review_finish`.

``ror review start NAME -a alice@lab.org -a bob@lab.org`` does what used to take six commands:

1. makes sure a Label Studio server answers at the configured URL (:func:`ensure_server`: starts
   the local one through ``scripts/labelstudio.sh``, installs it only when asked);
2. creates the study (the options of ``ror review create``) unless it exists;
3. creates a Label Studio account for every annotator who has none, and for the adjudicator
   (``--adjudicator EMAIL``) if there is one (signup through the organization's invite link, a
   random password returned once and never stored);
4. pushes the study (idempotent: only missing projects and tasks are created);
5. returns each annotator's project link, login link and, for a new account, the password; the
   same for the adjudicator (whose project ``ror review adjudicate`` creates once annotation has
   closed: :func:`adjudicator_account` is that step's account check).

``ror review finish NAME`` pulls the annotations and computes the figures of
``ror agree --study NAME --with-judge`` (with ``--weighted`` when every item of the study has an
inclusion probability and there is a control stratum), and writes the agreement report.

Every step stays available alone (``review create / push / pull``, ``ror agree``); these two
functions call exactly those steps. Secrets: the Label Studio API key comes from the environment
(or, for a server this module just started, from ``scripts/labelstudio.sh env``) and the new
passwords live only in the returned summary (``repr=False``); neither reaches the store, a run's
parameters or a log.

Error codes (:class:`~ror_annotate.errors.ReviewError`): E740 no server answers and Label Studio
is not installed (the message gives the exact command); E741 no server answers at a URL ror cannot
start a server for (not loopback); E742 the study exists with other annotators; E743 a new study
without annotators; E744 ``scripts/labelstudio.sh`` failed or is missing; E772 ``review finish`` of a
study whose annotators have labelled nothing yet.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from pydantic import Field

from ..errors import ReviewError
from ..options import Resamples, Seed, StageOptions
from ..provenance import scrub_url
from .adjudicate import adjudicator_is_annotator, check_adjudicator, set_adjudicator
from .labelstudio import KEY_ENV, LabelStudioClient, server_url, signup_annotator
from .studies import StudyOptions, check_email, check_study_name, ensure_tables, load_study, person_email, pseudonym_for, study_design, study_people
from .sync import ADJUDICATION_ROLE, PullReport, PushReport, _project_refs, pull_study, push_study, require_accounts

#: Code of ``review finish`` on a study whose annotators have labelled nothing yet.
NOTHING_LABELLED = "E772"

if TYPE_CHECKING:  # pragma: no cover
    from ..store import Store

LOOPBACK = ("127.0.0.1", "localhost", "::1")
_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789"  # no 0/O, 1/l/I: read off a terminal


# ------------------------------------------------------------------------------------ options
class ReviewStartOptions(StudyOptions):
    """Options of ``ror review start`` / :func:`review_start`: those of ``ror review create``
    (:class:`~.studies.StudyOptions`, used only when the study does not exist yet) plus the server.

    ``annotators`` are Label Studio account e-mails (needed for a new study; on a re-run they must
    be the study's annotators, or be left out). ``url`` / ``public_url`` default to
    ``$LABEL_STUDIO_URL`` / ``$LABEL_STUDIO_PUBLIC_URL`` (then ``http://127.0.0.1:8089``).
    ``install`` lets :func:`ensure_server` install Label Studio (about 3-4 minutes) when it is missing.
    """

    stage: ClassVar[str] = "ror review start"
    annotators: tuple[str, ...] = ()
    trace_ids: tuple[str, ...] | None = None
    url: str | None = None
    public_url: str | None = None
    install: bool = False
    restore_config: bool = False

    def study_options(self) -> StudyOptions:
        """The :class:`StudyOptions` part (what ``ror review create`` takes)."""
        return StudyOptions(**{k: getattr(self, k) for k in StudyOptions.model_fields if k != "stage"})


class ReviewFinishOptions(StageOptions):
    """Options of ``ror review finish`` / :func:`review_finish`.

    ``weighted``: None (default) uses inverse-probability weights exactly when the study stores an
    inclusion probability for every item and has a control stratum; True insists (E720/E721 as
    ``ror agree --weighted``); False never weights. ``with_judge``: also compare the machine raters
    on the study's segments (judge-vs-human figures). ``report``: folder of ``agreement.md`` /
    ``agreement.json`` / figures (None: no report). The bootstrap settings are ``ror agree``'s.
    """

    stage: ClassVar[str] = "ror review finish"
    url: str | None = None
    public_url: str | None = None
    strict_offsets: bool = False
    with_judge: bool = True
    weighted: bool | None = None
    reference: str | None = "majority"
    n_resamples: Resamples = 1000
    confidence_level: float = 0.95
    seed: Seed = 0
    n_bins: int = Field(10, ge=1, le=1000)  # reliability.MAX_BINS
    report: Path | None = None


# ------------------------------------------------------------------------------------ the server
@dataclass(frozen=True)
class ServerStatus:
    """A Label Studio server that answers: ``url`` ror calls, whether this call ``started`` or
    ``installed`` it, and the admin token to use when the environment gives none (only for a server
    this call started; never printed or stored)."""

    url: str
    started: bool = False
    installed: bool = False
    api_key: str | None = field(default=None, repr=False)


def server_up(url: str, *, timeout: float = 3.0) -> bool:
    """Whether a Label Studio server answers ``GET {url}/health/`` with ``{"status": "UP"}``."""
    import httpx

    try:
        return httpx.get(f"{url.rstrip('/')}/health/", timeout=timeout).json().get("status") == "UP"
    except (httpx.HTTPError, ValueError, AttributeError):
        return False


def find_script() -> Path | None:
    """``scripts/labelstudio.sh``: from the current directory up, else beside the installed package."""
    for base in [Path.cwd(), *Path.cwd().parents, Path(__file__).resolve().parents[2]]:
        candidate = base / "scripts" / "labelstudio.sh"
        if candidate.is_file():
            return candidate
    return None


def _script_env(url: str, public: str | None) -> dict[str, str]:
    """The environment of ``scripts/labelstudio.sh`` for a local ``url``: its host and port."""
    parts = urlsplit(url)
    env = dict(os.environ)
    env["LS_HOST"] = parts.hostname or "127.0.0.1"
    env["LS_PORT"] = str(parts.port or (443 if parts.scheme == "https" else 80))
    if public:
        env["LS_PUBLIC_URL"] = public
    return env


def _run_script(script: Path, action: str, env: dict[str, str], *, capture: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    bash = shutil.which("bash")
    if bash is None:
        raise ReviewError("bash is needed to run scripts/labelstudio.sh", code="E744")
    return subprocess.run([bash, str(script), action], env=env, capture_output=capture, text=True, timeout=timeout, check=False)


def _last_line(done: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in ((done.stderr or "") + "\n" + (done.stdout or "")).splitlines() if ln.strip() and not ln.startswith("export ")]
    return lines[-1].strip() if lines else f"exit status {done.returncode}"


def ensure_server(url: str | None = None, *, public: str | None = None, install: bool = False, script: Path | None = None,
                  say: Any = None, install_flag: bool = True) -> ServerStatus:
    """Make sure a Label Studio server answers at ``url``, starting the local one if needed.

    Parameters
    ----------
    url : str, optional
        Server URL (default ``$LABEL_STUDIO_URL``, else ``http://127.0.0.1:8089``).
    public : str, optional
        The public URL the server is started with (``LS_PUBLIC_URL``), if it is started.
    install : bool
        Install Label Studio (``scripts/labelstudio.sh install``, about 3-4 minutes) when it is not installed.
    script : Path, optional
        ``scripts/labelstudio.sh`` (default: :func:`find_script`).
    say : callable, optional
        ``say(text)`` for progress lines ("starting Label Studio ...").
    install_flag : bool
        Whether the calling command has ``--install`` (the E740 message then names it; else the
        script's own commands).

    Returns
    -------
    ServerStatus
        With the admin token from ``scripts/labelstudio.sh env`` when this call started the server.

    Raises
    ------
    ReviewError
        E740: nothing answers, Label Studio is not installed and ``install`` is False (the message
        gives the exact command); E741: nothing answers at a URL that is not loopback (ror starts
        only a local server); E744: the script is missing or failed (its last line is quoted).
    """
    url = server_url(url)
    if server_up(url):
        return ServerStatus(url)
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in LOOPBACK:
        raise ReviewError(
            f"no Label Studio server answers at {scrub_url(url)}, and ror starts only a local one (http://127.0.0.1:PORT): "
            "start that server where it runs, or fix --url / LABEL_STUDIO_URL", code="E741")
    script = script or find_script()
    if script is None:
        raise ReviewError(
            f"no Label Studio server answers at {scrub_url(url)} and scripts/labelstudio.sh is not found from the current "
            "directory: run from the ror_annotate checkout, or start a server and set LABEL_STUDIO_URL", code="E744")
    env = _script_env(url, public)
    installed = False
    if _run_script(script, "installed", env).returncode != 0:
        if not install:
            how = (f"run the same command again with --install (about 3-4 minutes), or `bash {script} install`" if install_flag
                   else f"install and start it with `bash {script} install && bash {script} start` (about 3-4 minutes), or `ror review start NAME --install`")
            raise ReviewError(
                f"no Label Studio server answers at {scrub_url(url)} and Label Studio is not installed: {how}", code="E740")
        if say:
            say(f"installing Label Studio with `bash {script} install` (about 3-4 minutes) ...")
        done = _run_script(script, "install", env)
        if done.returncode != 0:
            raise ReviewError(f"`bash {script} install` failed: {_last_line(done)}", code="E744")
        installed = True
    if say:
        say(f"starting Label Studio at {scrub_url(url)} (first start about 50-90 s, later about 10 s) ...")
    done = _run_script(script, "start", env)
    if done.returncode != 0 or not server_up(url):
        raise ReviewError(f"`bash {script} start` failed: {_last_line(done)}", code="E744")
    key = next((ln.split("=", 1)[1] for ln in done.stdout.splitlines() if ln.startswith(f"export {KEY_ENV}=")), None)
    return ServerStatus(url, started=True, installed=installed, api_key=key)


def local_api_key(url: str, script: Path | None = None) -> str | None:
    """The admin token ``scripts/labelstudio.sh env`` gives for the local server at ``url`` (the one
    it starts with ``LS_ADMIN_TOKEN``, else its development default), or None when ``url`` is not
    loopback or the script is not found. Used only when ``$LABEL_STUDIO_API_KEY`` is unset."""
    parts = urlsplit(url)
    script = script or find_script()
    if parts.scheme != "http" or parts.hostname not in LOOPBACK or script is None:
        return None
    done = _run_script(script, "env", _script_env(url, None), timeout=60)
    return next((ln.split("=", 1)[1] for ln in done.stdout.splitlines() if ln.startswith(f"export {KEY_ENV}=")), None)


def _client(status: ServerStatus, public: str | None) -> LabelStudioClient:
    """A client of the server: the API key from the environment, else the one of the server this call
    started, else (a local server ``scripts/labelstudio.sh`` manages) the script's own."""
    key = os.environ.get(KEY_ENV) or status.api_key or local_api_key(status.url)
    return LabelStudioClient(status.url, key, public=public)


# ------------------------------------------------------------------------------------ start
@dataclass(frozen=True)
class AnnotatorLink:
    """What one annotator needs: their own project's link, the login page, and a new account's password.

    ``password`` is set only when :func:`review_start` created the account in this call (shown
    once; never stored). It is left out of ``repr`` so logging the summary cannot leak it.
    """

    email: str
    pseudonym: str
    project_id: int
    project_url: str
    login_url: str
    new_account: bool
    password: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class AdjudicatorLink:
    """What the adjudicator needs: the login page, a new account's password, and the adjudication project's link.

    ``project_url`` is None until ``ror review adjudicate`` has created the adjudication project
    (after annotation has closed). ``password`` is set only when this call created the account
    (shown once; never stored) and is left out of ``repr``.
    """

    email: str
    pseudonym: str
    login_url: str
    project_url: str | None
    new_account: bool
    password: str | None = field(default=None, repr=False)


def adjudicator_account(store: "Store", name: str, client: LabelStudioClient, adjudicator: str | None = None) -> AdjudicatorLink | None:
    """Make ``adjudicator`` study ``name``'s adjudicator (when given) and create their Label Studio account if missing.

    Idempotent: an existing account is left alone (no password), an adjudicator already set is kept.
    Used by :func:`review_start` and before ``ror review adjudicate`` runs, so the adjudicator never
    has to sign up by hand.

    Parameters
    ----------
    store : Store
        Writable store holding the study.
    name : str
        The study.
    client : LabelStudioClient
        The server (admin API key).
    adjudicator : str, optional
        The adjudicator's e-mail; default the study's adjudicator, if any.

    Returns
    -------
    AdjudicatorLink or None
        None when the study has no adjudicator and none is given.

    Raises
    ------
    InputError
        E100: ``adjudicator`` is not an e-mail.
    ConfigError
        The study already has another adjudicator.
    ReviewError
        The server refused the signup, or is unreachable (E600); a new ``adjudicator`` is then not
        recorded (the same command with a corrected e-mail goes on).
    """
    passwords: dict[str, str] = {}
    if adjudicator:
        check_adjudicator(store, name, adjudicator)  # E100 / another adjudicator: before the server
        # the account first: a sign-up the server refuses must not leave the study with an adjudicator
        # who can never log in (a re-run with the right e-mail was then refused as "another adjudicator")
        passwords = create_accounts(client, [check_email(adjudicator, role="adjudicator").lower()])
        set_adjudicator(store, name, adjudicator)
    study = load_study(store, name)
    if not study.adjudicator:
        return None
    email = person_email(store, study.adjudicator)
    passwords.update(create_accounts(client, [email]))  # an adjudicator set earlier: their account, if it went missing
    refs = _project_refs(store, name, ADJUDICATION_ROLE)
    return AdjudicatorLink(email=email, pseudonym=study.adjudicator, login_url=f"{client.public_url}/user/login/",
                           project_url=client.project_url(refs[0].ls_project_id) if refs else None,
                           new_account=email in passwords, password=passwords.get(email))


@dataclass
class ReviewStartSummary:
    """What :func:`review_start` did: the server, the study (created now or existing), the push, the links.

    ``design`` is the study's sampling design when its strategy has one (``population``, and for
    ``uncertainty`` ``m``, ``n_control``, ``basis``; see :func:`~.studies.sample_uncertainty`).
    ``adjudicator``: the adjudicator's links (None when the study has none).
    """

    study: str
    created: bool
    server: ServerStatus
    public_url: str
    push: PushReport
    annotators: list[AnnotatorLink]
    strategy: str
    design: dict[str, Any] | None = None
    adjudicator: AdjudicatorLink | None = None


def _check_people(store: "Store", name: str, emails: list[str]) -> None:
    have = study_people(store, name)
    if emails and sorted(pseudonym_for(store, e) for e in emails) != have:
        listed = ", ".join(sorted(person_email(store, p) for p in have))
        raise ReviewError(
            f"study {name!r} exists with the annotators {listed}; re-run `ror review start {name}` without -a (or with "
            "exactly those), or pick another study name", code="E742")


def create_accounts(client: LabelStudioClient, emails: list[str]) -> dict[str, str]:
    """Sign up every e-mail of ``emails`` that has no account yet; ``{email: new password}``.

    Passwords are 16 random letters and digits (:mod:`secrets`, about 95 bits), returned once and
    kept nowhere else. Uses :func:`~.labelstudio.signup_annotator` (the organization's invite link,
    as a person would in a browser).

    Raises
    ------
    ReviewError
        The server refused a signup (the message names the e-mail; local output only).
    """
    have = client.users_by_email()
    created: dict[str, str] = {}
    invite = None
    for email in emails:
        if email.lower() in have:
            continue
        invite = invite or client.invite_url()
        password = "".join(secrets.choice(_ALPHABET) for _ in range(16))
        signup_annotator(client.url, invite, email, password)
        created[email] = password
    return created


def review_start(store: "Store", name: str, options: ReviewStartOptions | None = None, *,
                 client: LabelStudioClient | None = None, say: Any = None, **kwargs: Any) -> ReviewStartSummary:
    """Start (or resume) a review study end to end: server, study, accounts, push, links.

    Parameters
    ----------
    store : Store
        Writable store holding segmented traces (and machine labels for the ``uncertainty`` /
        ``disagreement`` / ``stratified`` strategies).
    name : str
        Study name; an existing study is reused as it is (never re-sampled).
    options : ReviewStartOptions, optional
        Or its fields as keywords (``annotators=[...], strategy="uncertainty", n=200``).
    client : LabelStudioClient, optional
        A client to use instead of the server of ``options.url`` (then no server is started).
    say : callable, optional
        ``say(text)`` for progress lines.

    Returns
    -------
    ReviewStartSummary
        ``annotators`` in pseudonym order, each with project link, login link and, for accounts
        created now, the password (not stored anywhere); ``adjudicator`` likewise
        (:func:`adjudicator_account`), when the study has one.

    Raises
    ------
    ReviewError
        E740 / E741 / E744 (:func:`ensure_server`), E742 (the study exists with other
        annotators), E743 (a new study without annotators), E600 (server errors, bad API key).
    ConfigError
        ``adjudicator`` differs from the existing study's adjudicator (checked before the server).
    ConfigError, InputError
        As :func:`~.studies.create_study` (bad options, nothing to sample); nothing is stored.
    """
    o = ReviewStartOptions.resolve(options, kwargs)
    check_study_name(name)  # before a server is started or anything is written (a bad name was a pydantic traceback)
    emails = list(dict.fromkeys(check_email(e).lower() for e in o.annotators))
    ensure_tables(store)
    exists = store.execute("SELECT 1 FROM review_studies WHERE name = ?", [name]).fetchone() is not None
    if exists:
        _check_people(store, name, emails)
        if o.adjudicator:
            check_adjudicator(store, name, o.adjudicator)  # another adjudicator: refused before a server is started
    elif not emails:
        raise ReviewError(f"study {name!r} is new: name its annotators with -a EMAIL (repeat), e.g. -a alice@lab.org -a bob@lab.org", code="E743")
    elif o.adjudicator and check_email(o.adjudicator, role="adjudicator").lower() in emails:
        raise adjudicator_is_annotator(o.adjudicator.strip().lower(), name)  # before a server is started
    if client is None:
        status = ensure_server(o.url, public=o.public_url, install=o.install, say=say)
        client = _client(status, o.public_url)
    else:
        status = ServerStatus(client.url)
    client.whoami()  # reachability and the API key, before anything is written
    if not exists:
        from .studies import create_study

        create_study(store, name, o.study_options(), annotators=emails, trace_ids=list(o.trace_ids) if o.trace_ids else None)
    study = load_study(store, name)
    people = study_people(store, name)
    email_of = {p: person_email(store, p) for p in people}
    passwords = create_accounts(client, [email_of[p] for p in people])
    adjudicator = adjudicator_account(store, name, client, o.adjudicator)
    require_accounts(store, name, client)
    with store.run("review push", {"study": name, "url": client.url, "public_url": client.public_url, "via": "review start"}) as run:
        report = push_study(store, name, client, restore_config=o.restore_config)
        run.counts.update(tasks_created=report.tasks_created, tasks_total=report.tasks_total,
                          accounts_created=len(passwords) + int(bool(adjudicator and adjudicator.new_account)))
    login = f"{client.public_url}/user/login/"
    links = [AnnotatorLink(email=email_of[p], pseudonym=p, project_id=pid, project_url=purl, login_url=login,
                           new_account=email_of[p] in passwords, password=passwords.get(email_of[p]))
             for p, pid, purl, _, _ in report.projects]
    return ReviewStartSummary(study=name, created=not exists, server=status, public_url=client.public_url, push=report,
                              annotators=links, strategy=study.strategy, design=study.parameters.get("design"), adjudicator=adjudicator)


# ------------------------------------------------------------------------------------ finish
@dataclass
class ReviewFinishSummary:
    """What :func:`review_finish` did: the pull, the agreement figures (the dict ``ror agree --json``
    prints), whether they are weighted (and why not), where the report went, and the equivalent
    separate commands."""

    study: str
    pull: PullReport
    agreement: dict[str, Any]
    weighted: bool
    weighted_note: str | None
    report: Path | None
    reliability_png: Path | None
    commands: list[str]


def weighting_possible(store: "Store", name: str) -> tuple[bool, str | None]:
    """Whether study ``name`` supports weighted estimates: ``(True, None)``, or ``(False, why not)``.

    True when every item stores an inclusion probability and some item is in the control stratum
    (what ``ror agree --weighted`` requires, E720 / E721).
    """
    study = load_study(store, name)
    design = study_design(store, name)
    if not design or any(p is None for _, _, p in design):
        return False, f"unweighted: strategy {study.strategy!r} stores no inclusion probabilities (use uncertainty or random)"
    if not any(s == "control" for _, s, _ in design):
        return False, "unweighted: the study has no control stratum (--control-fraction 0)"
    return True, None


def review_finish(store: "Store", name: str, options: ReviewFinishOptions | None = None, *,
                  client: LabelStudioClient | None = None, say: Any = None, **kwargs: Any) -> ReviewFinishSummary:
    """Pull a study's annotations and compute its agreement figures, as ``ror review pull`` then
    ``ror agree --study NAME --with-judge [--weighted] --report DIR``.

    Parameters
    ----------
    store : Store
        Writable store holding the study.
    name : str
        A pushed study.
    options : ReviewFinishOptions, optional
        Or its fields as keywords.
    client : LabelStudioClient, optional
        A client to use instead of the server of ``options.url`` (which is started if it is local
        and installed, as :func:`ensure_server` without installing).

    Returns
    -------
    ReviewFinishSummary
        ``agreement`` is :func:`ror_annotate.agreement.agreement_summary`'s dict, the same numbers
        as ``ror agree`` with the options listed in ``commands``.

    Raises
    ------
    ReviewError
        As ``ror review pull`` (study not pushed, server errors, people without an account); E772 no
        annotator has labelled anything yet (nothing to compute the agreement of).
    AgreementError
        As ``ror agree`` (one annotator only; with ``weighted=True`` E720-E722).
    """
    from ..agreement import agreement_summary

    o = ReviewFinishOptions.resolve(options, kwargs)
    load_study(store, name)
    if client is None:
        status = ensure_server(o.url, public=o.public_url, say=say, install_flag=False)
        client = _client(status, o.public_url)
    require_accounts(store, name, client)
    with store.run("review pull", {"study": name, "url": client.url, "strict_offsets": o.strict_offsets, "via": "review finish"}) as run:
        pull = pull_study(store, name, client, run_id=run.run_id, strict_offsets=o.strict_offsets)
        run.counts.update(labels_written=pull.labels_written, labels_removed=pull.labels_removed, rejected=len(pull.rejected))
    if pull.labels_written + pull.labels_unchanged == 0:
        # was E722 "pull the study's labels first" (weighted) or E700 "no labels match the selection":
        # finish has just pulled; the annotators have not labelled yet
        raise ReviewError(
            f"study {name!r} has no human labels yet (the pull found none in Label Studio): once the annotators have "
            f"labelled their projects, run `ror review finish {name}` again; `ror review status {name}` shows each "
            "annotator's progress",
            code=NOTHING_LABELLED,
        )
    possible, note = weighting_possible(store, name)
    weighted = possible if o.weighted is None else o.weighted
    if o.weighted is not None:
        note = None if weighted else "unweighted (weighted=False)"
    result = agreement_summary(
        store, study=name, with_judge=o.with_judge, reference=o.reference, n_resamples=o.n_resamples,
        confidence_level=o.confidence_level, seed=o.seed, n_bins=o.n_bins, weighted=weighted,
    )
    report = png = None
    if o.report is not None:
        from ..agreement.reliability import write_reliability_png
        from ..agreement_report import write_report

        report = Path(write_report(result, o.report))
        if result.get("calibration"):
            png = write_reliability_png(result["calibration"], o.report)
    agree = [f"ror agree --study {name}"] + (["--with-judge"] if o.with_judge else []) + (["--weighted"] if weighted else [])
    if o.reference != "majority":
        agree.append(f"--reference {o.reference or 'none'}")
    if o.report is not None:
        agree.append(f"--report {o.report}")
    return ReviewFinishSummary(study=name, pull=pull, agreement=result, weighted=weighted, weighted_note=note, report=report,
                               reliability_png=Path(png) if png else None, commands=[f"ror review pull {name}", " ".join(agree)])


__all__ = [
    "AdjudicatorLink", "AnnotatorLink", "ReviewFinishOptions", "ReviewFinishSummary", "ReviewStartOptions", "ReviewStartSummary", "ServerStatus",
    "adjudicator_account", "create_accounts", "ensure_server", "find_script", "local_api_key", "review_finish", "review_start", "server_up", "weighting_possible",
]
