"""What the sandbox seccomp profiles allow: data only, built into BPF by `_seccomp`.

Derived from Docker's default profile (github.com/moby/profiles, seccomp/default.json at commit
cd3bed8, June 2026), read the way runc reads it for a container that holds **no capabilities**
on the host's own architecture:

- its unconditional allowlist is `DOCKER_ALLOW` below, unchanged;
- its argument filters are kept: `socket` (no AF_VSOCK), `personality` (only the five values
  Docker lists), `clone` (only without namespace flags);
- `clone3` answers ENOSYS, as in Docker, so libc falls back to `clone`, whose flags can be checked;
- every call Docker grants only with a capability (mount, umount2, unshare, setns, bpf,
  perf_event_open, open_by_handle_at, kcmp, pidfd_getfd, syslog, chroot, reboot, acct, the module,
  clock-setting and NUMA-policy calls, ...) is denied: a sandbox process holds no capability;
- calls Docker never lists (keyctl, add_key, request_key, userfaultfd, io_uring_*, kexec_*,
  swapon, pivot_root, ...) are denied.

One deliberate change from Docker: `ptrace`, `process_vm_readv` and `process_vm_writev` (Docker
allows them on kernels >= 4.8) are left out of the default profile: nothing an agent normally runs
needs to trace another process, and ptrace has a long history of kernel bugs. The operator-chosen
`ptrace` profile adds them back for debuggers and profilers (gdb, strace, py-spy).
"""

from __future__ import annotations

_DOCKER_ALLOW_NAMES = """
_llseek _newselect accept accept4 access adjtimex alarm bind brk cachestat capget capset chdir chmod
chown chown32 clock_adjtime clock_adjtime64 clock_getres clock_getres_time64 clock_gettime
clock_gettime64 clock_nanosleep clock_nanosleep_time64 close close_range connect copy_file_range
creat dup dup2 dup3 epoll_create epoll_create1 epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2
epoll_wait epoll_wait_old eventfd eventfd2 execve execveat exit exit_group faccessat faccessat2
fadvise64 fadvise64_64 fallocate fanotify_mark fchdir fchmod fchmodat fchmodat2 fchown fchown32
fchownat fcntl fcntl64 fdatasync fgetxattr flistxattr flock fork fremovexattr fsetxattr fstat
fstat64 fstatat64 fstatfs fstatfs64 fsync ftruncate ftruncate64 futex futex_requeue futex_time64
futex_wait futex_waitv futex_wake futimesat get_robust_list get_thread_area getcpu getcwd getdents
getdents64 getegid getegid32 geteuid geteuid32 getgid getgid32 getgroups getgroups32 getitimer
getpeername getpgid getpgrp getpid getppid getpriority getrandom getresgid getresgid32 getresuid
getresuid32 getrlimit getrusage getsid getsockname getsockopt gettid gettimeofday getuid getuid32
getxattr getxattrat inotify_add_watch inotify_init inotify_init1 inotify_rm_watch io_cancel
io_destroy io_getevents io_pgetevents io_pgetevents_time64 io_setup io_submit ioctl ioprio_get
ioprio_set ipc kill landlock_add_rule landlock_create_ruleset landlock_restrict_self lchown lchown32
lgetxattr link linkat listen listmount listxattr listxattrat llistxattr lremovexattr lseek lsetxattr
lstat lstat64 madvise map_shadow_stack membarrier memfd_create memfd_secret mincore mkdir mkdirat
mknod mknodat mlock mlock2 mlockall mmap mmap2 mprotect mq_getsetattr mq_notify mq_open
mq_timedreceive mq_timedreceive_time64 mq_timedsend mq_timedsend_time64 mq_unlink mremap mseal
msgctl msgget msgrcv msgsnd msync munlock munlockall munmap name_to_handle_at nanosleep newfstatat
open openat openat2 pause pidfd_open pidfd_send_signal pipe pipe2 pkey_alloc pkey_free pkey_mprotect
poll ppoll ppoll_time64 prctl pread64 preadv preadv2 prlimit64 process_mrelease pselect6
pselect6_time64 pwrite64 pwritev pwritev2 read readahead readlink readlinkat readv recv recvfrom
recvmmsg recvmmsg_time64 recvmsg remap_file_pages removexattr removexattrat rename renameat
renameat2 restart_syscall riscv_hwprobe rmdir rseq rt_sigaction rt_sigpending rt_sigprocmask
rt_sigqueueinfo rt_sigreturn rt_sigsuspend rt_sigtimedwait rt_sigtimedwait_time64 rt_tgsigqueueinfo
sched_get_priority_max sched_get_priority_min sched_getaffinity sched_getattr sched_getparam
sched_getscheduler sched_rr_get_interval sched_rr_get_interval_time64 sched_setaffinity
sched_setattr sched_setparam sched_setscheduler sched_yield seccomp select semctl semget semop
semtimedop semtimedop_time64 send sendfile sendfile64 sendmmsg sendmsg sendto set_robust_list
set_thread_area set_tid_address setfsgid setfsgid32 setfsuid setfsuid32 setgid setgid32 setgroups
setgroups32 setitimer setpgid setpriority setregid setregid32 setresgid setresgid32 setresuid
setresuid32 setreuid setreuid32 setrlimit setsid setsockopt setuid setuid32 setxattr setxattrat
shmat shmctl shmdt shmget shutdown sigaltstack signalfd signalfd4 sigprocmask sigreturn socketcall
socketpair splice stat stat64 statfs statfs64 statmount statx symlink symlinkat sync sync_file_range
syncfs sysinfo tee tgkill time timer_create timer_delete timer_getoverrun timer_gettime
timer_gettime64 timer_settime timer_settime64 timerfd_create timerfd_gettime timerfd_gettime64
timerfd_settime timerfd_settime64 times tkill truncate truncate64 ugetrlimit umask uname unlink
unlinkat uretprobe utime utimensat utimensat_time64 utimes vfork vmsplice wait4 waitid waitpid write
writev
"""
DOCKER_ALLOW: tuple[str, ...] = tuple(_DOCKER_ALLOW_NAMES.split())

# Docker's per-architecture additions, keyed by the machine names Python reports.
ARCH_ALLOW: dict[str, tuple[str, ...]] = {
    "x86_64": ("arch_prctl", "modify_ldt"),
    "aarch64": ("arm_fadvise64_64", "arm_sync_file_range", "sync_file_range2", "breakpoint", "cacheflush",
                "set_tls"),
}

# socket(domain, ...): every address family but AF_VSOCK (40), a channel to the hypervisor.
AF_VSOCK = 40

# personality(persona): PER_LINUX, PER_LINUX32, UNAME26, UNAME26|PER_LINUX32 and the 0xffffffff query.
PERSONALITY_ALLOW = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
ADDR_NO_RANDOMIZE = 0x0040000  # what gdb sets to run a program without ASLR (ptrace profile only)

# clone(flags, ...) is allowed only when none of these namespace flags is set (Docker's mask
# 0x7E020000): NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET.
CLONE_NAMESPACE_FLAGS = 0x7E020000

# The calls the `ptrace` profile adds (Docker's own default allows them on kernels >= 4.8).
PTRACE_CALLS = ("ptrace", "process_vm_readv", "process_vm_writev")

PROFILES = ("default", "ptrace")
