#!/bin/bash
## The job script `benchmark/run.py --slurm` (and `bash benchmark/ppo.sh --slurm FAMILY`) submits.
## Copy this file, add what your site needs (an account, a QOS, memory, `module load`, activating
## an environment) and pass the copy with --slurm-template. Lines that start with `##`, like these,
## are notes about the template: they are left out of the job scripts. The runner fills the
## placeholders below and refuses a template that lacks one of them (an option you do not pass
## leaves its line empty):
##
##   {job_name}        the job's name: ppo-benchmark-<variant> for the runs, ppo-benchmark-report
##                     for the report job that runs after them
##   {output}          the file Slurm writes the job's own output to, an absolute path (%A the
##                     array's job id, %a the task index; %j the report job's id); each run's output
##                     also goes to its usual log
##                     The runner puts these two values in double quotes itself, so that a path
##                     with spaces works: leave the placeholders unquoted (a quoted one is quoted
##                     only once).
##   {array_line}      `#SBATCH --array=...`: the indices of the runs still to do (finished ones are
##                     left out); empty in the report job
##   {resource_lines}  one `#SBATCH` line per resource option: --partition, --gpus N (as
##                     --gres=gpu:N), --cpus-per-task (default 1), --time; the report job gets the
##                     partition and time. In the job array also
##                     --signal=B:USR1@<--warning-seconds>, the warning before the time limit, and
##                     with --requeue, --requeue and --open-mode=append
##   {command}         what the job runs: `cd` to where run.py was started, then
##                     `exec run.py ... --task-index $SLURM_ARRAY_TASK_ID`, which runs that one run
##                     exactly as run.py without --slurm would (or, in the report job, report.py).
##                     `exec`: the runner is the batch shell, which Slurm's warning (B:USR1)
##                     reaches; it passes it on to the run, which saves and stops. A site's wrapper
##                     around {command} must pass on SIGUSR1 too (trap it, and `wait`).
##
## sbatch reads `#SBATCH` lines only up to the first command, so keep yours above `set`.
#SBATCH --job-name={job_name}
#SBATCH --output={output}
{array_line}
{resource_lines}

set -euo pipefail
# Site setup goes here, e.g. `module load cuda`. The runner names its own Python by its full path,
# so the environment that ran run.py runs the tasks: it has to be on a disk every node sees.

{command}
