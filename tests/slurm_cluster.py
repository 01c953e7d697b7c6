"""A one-node Slurm cluster on this machine, from Debian's `slurm-wlm` and `munge` packages, for the
end-to-end test of `benchmark/run.py --slurm` and for trying it by hand:

    python tests/slurm_cluster.py /tmp/cluster     # start; prints the SLURM_CONF to export;
                                                   # Ctrl-C stops

Everything lives in one directory: a munge key and socket, slurm.conf, the daemons' state, spool,
logs and pid files. munged, slurmctld and slurmd run as the current user (root here, as in CI) on
free ports of 127.0.0.1, so a cluster started by hand and one started by a test do not meet, and
nothing of the system's own Slurm or munge configuration is read or changed. Clients (sbatch,
squeue, sinfo) find the cluster through the SLURM_CONF environment variable that `environment()`
returns.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from conftest import HUNG_AFTER

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol")


def missing_programs() -> list[str]:
    """The programs a cluster needs that are not installed (the sbin ones are often off a user's
    PATH)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [name for name in DAEMONS if shutil.which(name, path=path) is None]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class OneNodeCluster:
    """munged + slurmctld + slurmd in `directory`; start() waits until the node takes jobs."""

    def __init__(self, directory: Path):
        self.dir = Path(directory).resolve()
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge.socket"
        self.processes: list[subprocess.Popen] = []
        self.path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])

    def environment(self) -> dict[str, str]:
        """What a client (sbatch, squeue, run.py --slurm) needs to talk to this cluster."""
        return {"SLURM_CONF": str(self.conf), "PATH": self.path}

    def write_config(self) -> None:
        # Slurm checks that SlurmctldHost and the node name are this machine's host name; the
        # address in brackets keeps all traffic on the loopback interface.
        host = socket.gethostname().split(".")[0]
        cpus = os.cpu_count() or 1
        for sub in ("state", "spool"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.conf.write_text("\n".join([
            "ClusterName=ppo-test",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={self.dir / 'state'}",
            f"SlurmdSpoolDir={self.dir / 'spool'}",
            f"SlurmctldPidFile={self.dir / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.dir / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.dir / 'slurmctld.log'}",
            f"SlurmdLogFile={self.dir / 'slurmd.log'}",
            # No cgroups: the processes of a job are tracked through /proc, nothing is confined.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            # Schedule as soon as something changes, not once a minute, so a test does not wait
            # idle.
            "SchedulerType=sched/builtin",
            "SchedulerParameters=sched_interval=1",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            # Use the node as described here, whatever the hardware reports about sockets and
            # memory.
            "SlurmdParameters=config_overrides",
            f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 State=UNKNOWN",
            f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))

    def start_munge(self) -> None:
        key = self.dir / "munge.key"
        subprocess.run(["mungekey", "--create", "--keyfile", str(key), "--force"], check=True,
                       env={**os.environ, "PATH": self.path}, capture_output=True)
        key.chmod(0o400)
        # --force: munged refuses to run as root, or with its files outside /etc and /run, without
        # it.
        subprocess.run(["munged", "--force", "--key-file", str(key), "--socket",
                        str(self.munge_socket), "--pid-file", str(self.dir / "munged.pid"),
                        "--log-file", str(self.dir / "munged.log"), "--seed-file",
                        str(self.dir / "munged.seed")], check=True,
                       env={**os.environ, "PATH": self.path}, capture_output=True)

    def start(self, timeout: float = HUNG_AFTER) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.write_config()
        self.start_munge()
        env = {**os.environ, **self.environment()}
        for daemon in (["slurmctld", "-D", "-i"], ["slurmd", "-D"]):
            log = open(self.dir / f"{daemon[0]}.out", "w")
            self.processes.append(
                subprocess.Popen(daemon, env=env, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True))
        deadline = time.time() + timeout
        while time.time() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"{process.args[0]} exited with code {process.returncode}: "
                                       f"{self.log_tails()}")
            state = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env,
                                   capture_output=True, text=True)
            if state.returncode == 0 and state.stdout.strip() == "idle":
                return
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the node was not idle after {timeout:.0f}s: {self.log_tails()}")

    def log_tails(self) -> str:
        tails = []
        for name in ("munged.log", "slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out"):
            path = self.dir / name
            if path.exists():
                tails.append(f"\n--- {path}\n"
                             + "\n".join(path.read_text(errors="replace").splitlines()[-15:]))
        return "".join(tails)

    def stop(self) -> None:
        """Stop the daemons this object started, and the munged it started (by its pid file)."""
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:  # a daemon deaf to SIGTERM is killed: stopping the cluster must not hang
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes = []
        pid_file = self.dir / "munged.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text().strip()), 15)
            except (ValueError, ProcessLookupError):
                pass
            pid_file.unlink(missing_ok=True)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    missing = missing_programs()
    if missing:
        print(f"slurm_cluster.py: error: {', '.join(missing)} not installed: "
              "apt-get install slurm-wlm munge", file=sys.stderr)
        return 2
    # `kill` stops the cluster as Ctrl-C does, so no daemon outlives this script.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    cluster = OneNodeCluster(Path(sys.argv[1]))
    cluster.start()
    print(f"one-node Slurm cluster up; in another shell:\n    export SLURM_CONF={cluster.conf}\n"
          "Ctrl-C here stops it.", flush=True)
    try:
        while all(process.poll() is None for process in cluster.processes):
            time.sleep(1)
        print(f"a daemon exited: {cluster.log_tails()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
