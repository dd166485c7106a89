"""The process that runs *inside* a bubblewrap sandbox and executes solutions, one job at a time.

Started by :class:`wmrl_research.sandbox.Sandbox` as ``python /opt/wmrl/sandbox_worker '<config>'``
inside ``bwrap`` (no network, read-only system, a tmpfs ``/tmp``). A warm worker pre-imports the
heavy libraries (numpy, scikit-learn, torch, ...) once, so a job costs a fork instead of 1.5-2 s
of imports. Ahead of each job (while the previous one runs, or right after it) it forks a
*supervisor* that

1. enters a new mount, PID and IPC namespace (other jobs' folders, processes and System V / POSIX
   IPC objects become invisible),
2. mounts a fresh size-limited tmpfs that serves as the job's working folder and as its
   ``/dev/shm``, and a fresh ``mqueue`` file system at ``/dev/mqueue``,
3. forks the *job* process (PID 1 of the new namespace: when it dies the kernel kills every
   process the job started, so nothing outlives it), which mounts its own read-only ``/proc``
   and waits; where the host gave the worker cgroups (bound at ``CGROUP_DIR``), the job is moved
   into ``cpuacct``/``memory`` groups of its own (the CPU time it spends on the sandbox's setup is
   subtracted from its figure).

When a request arrives the job opens its stdout/stderr in its host folder, hides every job folder
(and the cgroups) under an empty tmpfs, sets rlimits, drops to an unprivileged uid (losing every
capability) and runs ``solution.py`` in-process. The supervisor waits at most the wall-clock
timeout (then SIGKILLs the job, hence its whole namespace), reaps it, takes its CPU time and peak
memory from the job's cgroups (else from ``wait4``; never from the job), copies ``predictions.npy``
(a regular file, bounded size, no symlinks), removes every IPC object and tmpfs the job left (so
their memory is free before the next job starts) and writes a ``result.json`` into the job's host
folder.

Protocol: one JSON request per line on stdin, one JSON reply per line on the original stdout
(fd 1 is redirected to stderr so that nothing else can write a reply).

Modules (each imports only the standard library: the worker must start fast, and the sandbox mounts
this folder alone, so a job sees no other project code): :mod:`.serve` (the main loop),
:mod:`.supervisor` (the per-job supervisor), :mod:`.job_resources` (the job's tmpfs, IPC cleanup,
cgroups), :mod:`.job` (the job process: limits, uid, running the solution), :mod:`.seccomp` (the
job's syscall filter, the session keyring) and :mod:`.common` (paths, mount flags, libc calls).

Imports: the modules import each other relatively (``from .common import ...``), so they form one
package whatever the folder is called: ``wmrl_research.sandbox_worker`` on the host (tests, type
checks), ``sandbox_worker`` in the sandbox. ``python <folder>`` puts the folder itself on
``sys.path`` and runs ``__main__.py`` outside any package, where relative imports fail, so
``__main__.py`` replaces that entry by the folder's parent (``/opt/wmrl``, which holds nothing else)
and imports ``sandbox_worker.serve``. Flat imports (``import seccomp``) would work without that step
but make every module a top-level name in the worker and in every job forked from it (``sys.modules``),
shadowing a third-party module of the same name; ``python -m sandbox_worker`` would put the working
folder (``/tmp``, where the jobs live) on ``sys.path``.
"""
