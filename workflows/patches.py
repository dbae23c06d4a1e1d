"""The workflow's patches: each change that alters the commands of a running job, by the ID it gives
``workflow.patched``. A job started before a change replays its recorded history without the change's
marker and keeps its old behaviour; a job started after it takes the new one. Recorded histories of
earlier releases are replayed in CI (``tests/histories/``, ``tests/test_replay.py``)."""

from __future__ import annotations

KEEP_REQUEUED_FILES = "keep-requeued-files"
"""Files of a failed group, put back in ``pending`` while the next page was being listed, are kept
(v0.1.0 replaced ``pending`` with the new page, dropping them)."""
REPORT_ON_ANY_CANCEL = "report-on-any-cancel"
"""A job cancelled while a short activity (listing, check, report segment) is in flight still writes
its report (v0.1.0 ended without one)."""
FAIL_IF_EMPTY = "fail-if-empty"
"""A job with ``fail_if_empty`` whose prefix matched no file fails (``EmptyPrefix``) after writing its
report as failed (jobs before it could only succeed with 0 files)."""
HAND_OVER_STRAGGLERS = "hand-over-stragglers"
"""A run that has started its files stops the files still in flight after ``HAND_OVER_GRACE`` at their
next chunk boundary and hands them to the next run, which resumes them from their committed
checkpoint (v0.1.0 and v0.2.0 waited for every file in flight, leaving the other slots idle)."""

SPLIT_BIG_FILES = "split-big-files"
"""A file over ``split_bytes`` runs as byte-range splits at once (v0.2.0 and before: one activity a file)."""
HAND_OVER_SPLITS = "hand-over-splits"
"""A file in byte-range splits is handed over like any other straggler: its splits stop at a chunk boundary
and the next run starts the same splits again, each resuming from its checkpoint (before: a run with a file
in splits in flight waited for all of them before it continued as new, leaving the other slots idle)."""
LARGEST_FIRST = "largest-first"
"""The files of a listing page are started biggest first (v0.2.0 and before: in key order)."""
FAIL_ALL_REJECTED = "fail-all-rejected"
"""A file in byte-range splits whose every record was rejected, in a job that set neither
``max_rejected_records`` nor ``max_rejected_ratio``, is failed (``TooManyRejects``), as a whole file is by its
activity (before: such a file succeeded with 0 records written)."""
AFTER_SUCCESS = "after-success"
"""A job with ``after_success`` archives, deletes or tags each file that succeeded (one activity per file
activity that ended with succeeded files), before recording its result (jobs before: no such option)."""
HAND_OVER_FAILED_ATTEMPT = "hand-over-failed-attempt"
"""A file (or one of its splits) whose attempt failed, for a reason a retry may pass, after a hand-over asked it to
stop is handed over like the others: the server retries no activity it was asked to cancel, so the failure only
says the hand-over came first (before: the file was recorded failed, with attempts left)."""
UPGRADE_ON_NEW_VERSION = "upgrade-on-new-version"
"""Worker Versioning: a run that sees a newer worker version made current (or ramping to it) starts no more
files and hands its files in flight over to its continue-as-new successor, which starts on that version
(before: it went on to its ``files_per_run`` files, keeping the old version's workers busy that long)."""
STOPPED_ATTEMPT = "stopped-attempt"
"""A file (a group, a split) whose attempt failed for a reason a retry may pass, or timed out, after a cancel of the
job (or ``max_rejected_total``) asked it to stop is stopped, ``cancelled``, its committed output read back into the
report (before: a group's files were reported ``not_started``, a single or split file ``failed`` with no counts, though
their output was committed; found by the soak)."""
SHORT_ACTIVITIES_HEARTBEAT = "short-activities-heartbeat"
"""The short activities (the check, listing pages, report segments, the report, the ledger) are given the job's
heartbeat timeout and heartbeat while they run: one whose worker died is retried after that timeout (before: after
its 5-minute start-to-close timeout, its job waiting all that time; found by the soak)."""
FINAL_REPORT_STANDS = "final-report-stands"
"""A cancel of the job arriving once it has begun to close (its report, its ledger, its last handlers) does not stop
that: the report is written with the status it was begun with and the job ends so (before: the report activity was
cancelled and a ``cancelled`` report written, which the first attempt, still running on a frozen worker, then
overwrote with ``succeeded``: the job ended cancelled, its report saying succeeded; found by the soak, seed 79)."""
LOCAL_SHORT_ACTIVITIES = "local-check-and-listing"
"""The job's check and the pages of a prefix, a manifest or a redrive's report are local activities, run by the
worker of the workflow task that asks for them, the task going on without a round trip through the server (a
one-file job: five workflow tasks -> three). Steps that write what a later step relies on (the report, its
segments, the ledger, an incremental listing page) stay activities: a stale workflow task would run them on
waking (``workflows.schedule.LOCAL_STEPS``; an earlier form made them local too, and lost a run's report)."""
