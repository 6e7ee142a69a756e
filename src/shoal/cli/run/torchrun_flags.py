"""torchrun's flags as the installed torch declares them, frozen so that ``shoal run`` parses its
command line without importing torch (2-3 s of CPU before any error or ``--help``). Generated: do
not edit; write it again with ``python -m shoal.cli.run.args``.

One row per flag: (spellings, dest, action, type, default, choices, torchrun's help). ``action``:
``env`` (the default comes from ``PET_<DEST>``, as torchrun's), ``check_env`` (a switch, on when
``PET_<DEST>`` is a non-zero number) or ``store``; ``type``: ``str``, ``int``, ``float`` or ``list``
(comma-separated). :func:`shoal.cli.run.args.build_parser` builds ``shoal run``'s parser from them;
``tests/cli/test_help.py`` fails when torch's parser says something else (a torch release that adds,
drops or changes a flag).
"""

# fmt: off
FLAGS = (
    (('--nnodes',), 'nnodes', 'env', 'str', '1:1', None, 'Number of nodes, or the range of nodes in form <minimum_nodes>:<maximum_nodes>.'),
    (('--nproc-per-node', '--nproc_per_node'), 'nproc_per_node', 'env', 'str', '1', None, 'Number of workers per node; supported values: [auto, cpu, gpu, xpu, int].'),
    (('--rdzv-backend', '--rdzv_backend'), 'rdzv_backend', 'env', 'str', 'static', None, 'Rendezvous backend.'),
    (('--rdzv-endpoint', '--rdzv_endpoint'), 'rdzv_endpoint', 'env', 'str', '', None, 'Rendezvous backend endpoint; usually in form <host>:<port>.'),
    (('--rdzv-id', '--rdzv_id'), 'rdzv_id', 'env', 'str', 'none', None, 'User-defined group id.'),
    (('--rdzv-conf', '--rdzv_conf'), 'rdzv_conf', 'env', 'str', '', None, 'Additional rendezvous configuration (<key1>=<value1>,<key2>=<value2>,...).'),
    (('--standalone',), 'standalone', 'check_env', None, False, None, 'Start a local standalone rendezvous backend that is represented by a C10d TCP store on a free port. Useful when launching single-node, multi-worker job. If specified --rdzv-backend, --rdzv-endpoint, --rdzv-id are auto-assigned and any explicitly set values are ignored.'),
    (('--max-restarts', '--max_restarts'), 'max_restarts', 'env', 'int', 0, None, 'Maximum number of worker group restarts before failing.'),
    (('--monitor-interval', '--monitor_interval'), 'monitor_interval', 'env', 'float', 0.1, None, 'Interval, in seconds, to monitor the state of workers.'),
    (('--start-method', '--start_method'), 'start_method', 'env', 'str', 'spawn', ('spawn', 'fork', 'forkserver'), 'Multiprocessing start method to use when creating workers.'),
    (('--event-log-handler', '--event_log_handler'), 'event_log_handler', 'env', 'str', 'null', None, 'name of a registered event logging handler (see: https://docs.pytorch.org/docs/stable/elastic/events.html)'),
    (('--role',), 'role', 'env', 'str', 'default', None, 'User-defined role for the workers.'),
    (('-m', '--module'), 'module', 'check_env', None, False, None, "Change each process to interpret the launch script as a Python module, executing with the same behavior as 'python -m'."),
    (('--no-python', '--no_python'), 'no_python', 'check_env', None, False, None, "Skip prepending the training script with 'python' - just execute it directly. Useful when the script is not a Python script."),
    (('--run-path', '--run_path'), 'run_path', 'check_env', None, False, None, 'Run the training script with runpy.run_path in the same interpreter. Script must be provided as an abs path (e.g. /abs/path/script.py). Takes precedence over --no-python.'),
    (('--log-dir', '--log_dir'), 'log_dir', 'env', 'str', None, None, 'Base directory to use for log files (e.g. /var/log/torch/elastic). The same directory is reused for multiple runs (a unique job-level sub-directory is created with rdzv_id as the prefix).'),
    (('-r', '--redirects'), 'redirects', 'env', 'str', '0', None, 'Redirect std streams into a log file in the log directory (e.g. [-r 3] redirects both stdout+stderr for all workers, [-r 0:1,1:2] redirects stdout for local rank 0 and stderr for local rank 1).'),
    (('-t', '--tee'), 'tee', 'env', 'str', '0', None, 'Tee std streams into a log file and also to console (see --redirects for format).'),
    (('--log-line-prefix-template', '--log_line_prefix_template'), 'log_line_prefix_template', 'env', 'str', '', None, "Template for the prefix prepended to each console log line of a tee'd stream (e.g. [--log-line-prefix-template '${hostname}:${rank}: '] renders as 'r12i0n8:3: '). Available macros: ${role_name}, ${local_rank}, ${rank}, ${hostname}. Defaults to '[${role_name}${local_rank}]:'."),
    (('--local-ranks-filter', '--local_ranks_filter'), 'local_ranks_filter', 'env', 'str', '', None, 'Only show logs from specified ranks in console (e.g. [--local_ranks_filter=0,1,2] will only show logs from rank 0, 1 and 2). This will only apply to stdout and stderr, not tolog files saved via --redirect or --tee'),
    (('--duplicate-stdout-filters', '--duplicate_stdout_filters'), 'duplicate_stdout_filters', 'env', 'list', [], None, "Duplicates logs streamed to stdout to another specified file with a list of filters (e.g. [--duplicate_stdout_filters 'apple,orange'] will duplicate log lines matching 'apple' OR 'orange'. An empty filters list won't duplicate any lines. Use double comma to escape a comma) "),
    (('--duplicate-stderr-filters', '--duplicate_stderr_filters'), 'duplicate_stderr_filters', 'env', 'list', [], None, "Duplicates logs streamed to stderr to another specified file with a list of filters (e.g. [--duplicate_stdout_filters 'apple,orange'] will duplicate log lines matching 'apple' OR 'orange'. An empty filters list won't duplicate any lines. Use double comma to escape a comma) "),
    (('--node-rank', '--node_rank'), 'node_rank', 'env', 'int', 0, None, 'Rank of the node for multi-node distributed training. It is only used for static rendezvous (i.e., when ``--rdzv-backend=static``).'),
    (('--master-addr', '--master_addr'), 'master_addr', 'env', 'str', '127.0.0.1', None, 'Address of the master node (rank 0) that only used for static rendezvous. It should be either the IP address or the hostname of rank 0. For single node multi-proc training the --master-addr can simply be 127.0.0.1; IPv6 should have the pattern `[0:0:0:0:0:0:0:1]`.'),
    (('--master-port', '--master_port'), 'master_port', 'env', 'int', None, None, 'Port on the master node (rank 0) to be used for communication during distributed training. It is only used for static rendezvous. Defaults to 29500.'),
    (('--local-addr', '--local_addr'), 'local_addr', 'env', 'str', None, None, "Address of the local node. If specified, will use the given address for connection. Else, will look up the local node address instead. Else, it will be default to local machine's FQDN."),
    (('--logs-specs', '--logs_specs'), 'logs_specs', 'store', 'str', None, None, 'torchrun.logs_specs group entrypoint name, value must be type of LogsSpecs. Can be used to override custom logging behavior.'),
    (('--numa-binding', '--numa_binding'), 'numa_binding', 'store', 'str', None, ('node', 'socket', 'exclusive', 'core-complex'), 'Bind worker processes to CPUs near their assigned GPUs for better performance. See torch/numa/binding.py for available modes and details.'),
    (('--signals-to-handle', '--signals_to_handle'), 'signals_to_handle', 'env', 'str', 'SIGTERM,SIGINT,SIGHUP,SIGQUIT', None, 'Comma-separated list of signals to handle and forward to subprocesses. Default: SIGTERM,SIGINT,SIGHUP,SIGQUIT. Common additional signals: SIGUSR1,SIGUSR2 (used in SLURM environments).'),
    (('--shutdown-timeout', '--shutdown_timeout'), 'shutdown_timeout', 'env', 'int', None, None, 'Time in seconds to wait for graceful shutdown of worker processes before sending SIGKILL. If not specified, uses TORCH_ELASTIC_SHUTDOWN_TIMEOUT environment variable or defaults to 30 seconds.'),
    (('--virtual-local-rank', '--virtual_local_rank'), 'virtual_local_rank', 'check_env', None, False, None, 'Enable virtual local rank mode for workers. When enabled, LOCAL_RANK is set to 0 for all workers and CUDA_VISIBLE_DEVICES is adjusted so each worker accesses its assigned GPU at device index 0.'),
    (('--print-completion', '--print_completion'), 'print_completion', 'other', None, None, ('bash', 'zsh', 'tcsh'), "Print a shell completion script for torchrun to stdout and exit (e.g. [--print-completion zsh > ~/.zsh/completions/_torchrun]). Requires the optional 'shtab' package."),
)
# fmt: on
