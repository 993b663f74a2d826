/*
 * accalloc: a caching device-memory allocator with PyTorch-compatible statistics.
 *
 * Every fallible function returns an AccallocStatus; results come back through out-pointers. On failure,
 * accalloc_last_error_message() tells this thread what went wrong. `device` is an index of the current
 * accelerator, -1 meaning this thread's current device. `stream` is an opaque handle, NULL for the
 * default stream. All functions may be called from any thread, also from atexit handlers, C++ global
 * destructors and thread-local destructors. In a fork() child of a process that had used accalloc,
 * every call returns ACCALLOC_ERROR_NOT_SUPPORTED at once (the parent's state is not valid there).
 */

#ifndef ACCALLOC_H
#define ACCALLOC_H

/* Generated with cbindgen from src/capi by `cargo run -p accalloc-header`: do not edit by hand. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
/** The library's version as a string literal ("MAJOR.MINOR.PATCH"), for the preprocessor. */
#define ACCALLOC_VERSION_STRING ACCALLOC_VERSION_STRINGIFY(ACCALLOC_VERSION_MAJOR) "." ACCALLOC_VERSION_STRINGIFY(ACCALLOC_VERSION_MINOR) "." ACCALLOC_VERSION_STRINGIFY(ACCALLOC_VERSION_PATCH)
#define ACCALLOC_VERSION_STRINGIFY(x) ACCALLOC_VERSION_STRINGIFY_(x)
#define ACCALLOC_VERSION_STRINGIFY_(x) #x

/**
 * Check, at start-up, that the loaded library has the ABI this program was compiled for:
 * `if (ACCALLOC_CHECK_ABI() != ACCALLOC_OK) { fputs(accalloc_last_error_message(), stderr); exit(1); }`
 */
#define ACCALLOC_CHECK_ABI() accalloc_check_abi(ACCALLOC_ABI_VERSION)

/**
 * What a backend function returns on success.
 */
#define ACCALLOC_BACKEND_OK 0

/**
 * What a backend function returns when the device has no room: accalloc releases cached memory
 * and retries, as for a device out-of-memory error.
 */
#define ACCALLOC_BACKEND_OUT_OF_MEMORY 2

/**
 * Route to the pool the allocations of the calling thread, on any stream (use_mem_pool).
 */
#define ACCALLOC_ROUTE_THREAD 0

/**
 * Route to the pool the allocations on one stream, from any thread (a graph capture).
 */
#define ACCALLOC_ROUTE_STREAM 1

/**
 * Version of the binary interface. It changes only when a program built against an older header
 * could misbehave with this library; accalloc_abi_version() returns the library's value.
 */
#define ACCALLOC_ABI_VERSION 2

/**
 * Library version, major part (accalloc_version() gives the whole string).
 */
#define ACCALLOC_VERSION_MAJOR 0

/**
 * Library version, minor part.
 */
#define ACCALLOC_VERSION_MINOR 1

/**
 * Library version, patch part.
 */
#define ACCALLOC_VERSION_PATCH 0

/**
 * Index of the aggregate slot in each AccallocStat[3] array of AccallocDeviceStats.
 */
#define ACCALLOC_STAT_ALL 0

/**
 * Index of the small-pool slot (blocks of at most 1 MiB).
 */
#define ACCALLOC_STAT_SMALL_POOL 1

/**
 * Index of the large-pool slot.
 */
#define ACCALLOC_STAT_LARGE_POOL 2

/**
 * The result of every fallible call. On failure, accalloc_last_error_message() says what went wrong.
 */
typedef enum AccallocStatus {
  /**
   * Success.
   */
  ACCALLOC_OK = 0,
  /**
   * A NULL out-pointer, a NULL or unknown key, a value out of range.
   */
  ACCALLOC_ERROR_INVALID_ARGUMENT = 1,
  /**
   * A device index that does not exist.
   */
  ACCALLOC_ERROR_INVALID_DEVICE = 2,
  /**
   * A pointer accalloc did not hand out, or one already freed.
   */
  ACCALLOC_ERROR_INVALID_POINTER = 3,
  /**
   * The device (or the memory fraction) has no room, even after releasing cached memory.
   */
  ACCALLOC_ERROR_OUT_OF_MEMORY = 4,
  /**
   * The backend (driver) failed; the message carries its name and code.
   */
  ACCALLOC_ERROR_BACKEND = 5,
  /**
   * The current accelerator cannot do this.
   */
  ACCALLOC_ERROR_NOT_SUPPORTED = 6,
  /**
   * A bad setting in the environment or a configuration string.
   */
  ACCALLOC_ERROR_CONFIG = 7,
  /**
   * An output buffer is too small; the length out-parameter says how much is needed.
   */
  ACCALLOC_ERROR_BUFFER_TOO_SMALL = 8,
  /**
   * A bug in accalloc (a panic was caught at the boundary).
   */
  ACCALLOC_ERROR_INTERNAL = 9,
} AccallocStatus;

/**
 * What happened to a segment.
 */
typedef enum AccallocSegmentAction {
  /**
   * A new segment came from the device: register it.
   */
  ACCALLOC_SEGMENT_ALLOC = 0,
  /**
   * The segment is about to go back to the device: deregister it.
   */
  ACCALLOC_SEGMENT_FREE = 1,
  /**
   * Pages of an expandable segment were mapped: register them.
   */
  ACCALLOC_SEGMENT_MAP = 2,
  /**
   * Pages of an expandable segment are about to be unmapped: deregister them.
   */
  ACCALLOC_SEGMENT_UNMAP = 3,
} AccallocSegmentAction;

/**
 * A private pool's layout at one moment (its segments, and which blocks were handed out), taken
 * by accalloc_pool_checkpoint_on and freed by accalloc_pool_checkpoint_destroy. Opaque.
 */
typedef struct AccallocPoolCheckpoint AccallocPoolCheckpoint;

/**
 * A kind of accelerator. Built-in values are ACCALLOC_DEVICE_HOST and ACCALLOC_DEVICE_CUDA.
 */
typedef int32_t AccallocDeviceType;

/**
 * The functions of an accelerator backend, for accalloc_register_backend. Set struct_size to
 * sizeof(AccallocBackendVTable) (later versions may add entries at the end). The first four entries are
 * required; a NULL optional entry turns its feature off: without the five event functions,
 * accalloc_record_stream falls back to stream_synchronize when there is one and is otherwise
 * ACCALLOC_ERROR_NOT_SUPPORTED; without the five virtual-memory functions, expandable segments fall back
 * to ordinary segments; without host_alloc and host_free, pinned host memory (accalloc_host_malloc) is
 * ACCALLOC_ERROR_NOT_SUPPORTED; without copy_to_host and copy_from_host, a pause with a backup is. A
 * table from a caller built against an older header, whose struct_size ends before host_alloc (or
 * copy_to_host), is read up to its struct_size and lacks what follows. The functions may be called
 * from any thread, and with the same context concurrently for different devices. They may call
 * accalloc for other device types (the host, say), but not for their own: such a call returns ACCALLOC_ERROR_NOT_SUPPORTED, since the device is
 * locked or being set up while they run. What they hand back is checked: a segment or reservation
 * that is NULL, not aligned (512 bytes; reservations also to vm_granularity), wraps around the
 * address space or overlaps one accalloc holds is refused with ACCALLOC_ERROR_BACKEND and given back
 * with raw_free / vm_release; device_count must be 1 to 1024.
 */
typedef struct AccallocBackendVTable {
  /**
   * sizeof(AccallocBackendVTable) as the caller knows it.
   */
  size_t struct_size;
  /**
   * Passed as the first argument of every function.
   */
  void *context;
  /**
   * Required: how many devices the backend drives (at least 1).
   */
  int32_t (*device_count)(void *context, int32_t *out);
  /**
   * Required: allocate `size` bytes on `device` for `stream`, address 512-byte aligned, into *out.
   */
  int32_t (*raw_alloc)(void *context, int32_t device, size_t size, void *stream, void **out);
  /**
   * Required: free what raw_alloc returned (`size` as allocated).
   */
  int32_t (*raw_free)(void *context, int32_t device, void *ptr, size_t size);
  /**
   * Required: free and total bytes of `device`.
   */
  int32_t (*mem_get_info)(void *context, int32_t device, uint64_t *free, uint64_t *total);
  /**
   * Optional: create an event into *out.
   */
  int32_t (*event_create)(void *context, int32_t device, void **out);
  /**
   * Optional: record `event` on `stream`.
   */
  int32_t (*event_record)(void *context, int32_t device, void *event, void *stream);
  /**
   * Optional: set *complete to 1 when `event` has completed, 0 when not yet.
   */
  int32_t (*event_query)(void *context, int32_t device, void *event, int32_t *complete);
  /**
   * Optional: wait until `event` completes.
   */
  int32_t (*event_synchronize)(void *context, int32_t device, void *event);
  /**
   * Optional: destroy `event`.
   */
  int32_t (*event_destroy)(void *context, int32_t device, void *event);
  /**
   * Optional: wait until the work queued on `stream` is done.
   */
  int32_t (*stream_synchronize)(void *context, int32_t device, void *stream);
  /**
   * Optional: the mapping granularity of `device` in bytes, into *out.
   */
  int32_t (*vm_granularity)(void *context, int32_t device, size_t *out);
  /**
   * Optional: reserve `size` bytes of address space into *out.
   */
  int32_t (*vm_reserve)(void *context, int32_t device, size_t size, void **out);
  /**
   * Optional: back `size` bytes at `ptr` (inside a reservation) with memory.
   */
  int32_t (*vm_map)(void *context, int32_t device, void *ptr, size_t size);
  /**
   * Optional: give back the memory behind `size` bytes at `ptr`, keeping the addresses.
   */
  int32_t (*vm_unmap)(void *context, int32_t device, void *ptr, size_t size);
  /**
   * Optional: release a whole reservation.
   */
  int32_t (*vm_release)(void *context, int32_t device, void *ptr, size_t size);
  /**
   * Optional: allocate `size` bytes of pinned (page-locked) host memory, usable for asynchronous
   * copies with every device of the backend, into *out.
   */
  int32_t (*host_alloc)(void *context, size_t size, void **out);
  /**
   * Optional: free what host_alloc returned (`size` as asked for).
   */
  int32_t (*host_free)(void *context, void *ptr, size_t size);
  /**
   * Optional: copy `size` bytes of `device` memory at `src` to host memory at `dst`, done when it
   * returns (the backups of accalloc_pool_pause; without both copy entries a pause with a backup
   * is ACCALLOC_ERROR_NOT_SUPPORTED).
   */
  int32_t (*copy_to_host)(void *context, int32_t device, void *dst, const void *src, size_t size);
  /**
   * Optional: copy `size` bytes of host memory at `src` to `device` memory at `dst`, done when it
   * returns (accalloc_pool_resume puts the backups back with it).
   */
  int32_t (*copy_from_host)(void *context, int32_t device, void *dst, const void *src, size_t size);
} AccallocBackendVTable;

/**
 * A pool's id, PyTorch's MempoolId_t: {0, 0} is the default pools; accalloc_pool_create makes
 * {0, n}; a graph capture may name its own pool {n, 0}.
 */
typedef struct AccallocPoolId {
  uint64_t first;
  uint64_t second;
} AccallocPoolId;

/**
 * One segment event.
 */
typedef struct AccallocSegmentEvent {
  enum AccallocSegmentAction action;
  AccallocDeviceType device_type;
  int32_t device;
  /**
   * The pool the memory belongs to ({0, 0}: the default pools).
   */
  struct AccallocPoolId pool;
  /**
   * The whole segment (alloc, free) or the pages mapped or unmapped.
   */
  void *address;
  size_t size;
  /**
   * The stream the segment serves (NULL: the default stream).
   */
  void *stream;
} AccallocSegmentEvent;

/**
 * Told of every segment event, in order, while accalloc holds the event's device: it may not call
 * accalloc for that device type (such calls fail with ACCALLOC_ERROR_NOT_SUPPORTED), nor add or
 * remove observers. A free or unmap is told before the memory goes; if the device then refuses to
 * give it back, the memory stays and is told again as an alloc or map. May run on any thread.
 */
typedef void (*AccallocSegmentObserver)(const struct AccallocSegmentEvent *event, void *user_data);

/**
 * Told of every out-of-memory failure of a device after accalloc let the device go and before the
 * failing call returns, with PyTorch's figures: the segment size that could not be had, the memory
 * fraction's limit where one is set (else the device's total memory), and the device's free memory.
 * It may call accalloc (accalloc_empty_cache, say); a failure inside it is not told again.
 */
typedef void (*AccallocOomObserver)(AccallocDeviceType device_type,
                                    int64_t device,
                                    size_t alloc_size,
                                    size_t limit_or_total,
                                    size_t device_free,
                                    void *user_data);

/**
 * planned_placement's planner on one device. Set struct_size to sizeof(AccallocPlannerStats)
 * before calling accalloc_planner_stats: the library fills that many bytes at most, so a program
 * built against this header keeps working when later versions add fields at the end.
 */
typedef struct AccallocPlannerStats {
  /**
   * Size of this struct as the caller knows it; set by the caller, rewritten with the bytes filled.
   */
  size_t struct_size;
  /**
   * 1 when planned_placement is on for this device, 0 when it is off (the rest is then 0).
   */
  int32_t enabled;
  /**
   * 1 when a plan is in force now and the program keeps to it.
   */
  int32_t in_force;
  /**
   * Plans made (each replaces the one before).
   */
  int64_t plans;
  /**
   * Plans tried: made, or not made because they would not pay.
   */
  int64_t attempts;
  /**
   * Plans dropped because the requests stopped matching them.
   */
  int64_t dropped;
  /**
   * Requests given an address by a plan.
   */
  int64_t advised;
  /**
   * Of them, those whose range was taken, served by the ordinary policy instead.
   */
  int64_t conflicts;
  /**
   * Bytes the latest plan spans in its segment (0 before the first plan).
   */
  int64_t plan_height;
  /**
   * Of the requests given an address, those served from the block parked there (freed there
   * by the plan's request before, kept unmerged for it): the fast path.
   */
  int64_t from_parked;
  /**
   * The least the latest plan could span: the most bytes its step's blocks and the long-lived
   * blocks around them hold at once (what plan_height spans over it is what packing around
   * those costs; 0 before the first plan).
   */
  int64_t plan_floor;
} AccallocPlannerStats;

/**
 * One statistic, as PyTorch keeps it.
 */
typedef struct AccallocStat {
  /**
   * Value now.
   */
  int64_t current;
  /**
   * Highest value since the last accalloc_reset_peak_memory_stats.
   */
  int64_t peak;
  /**
   * Total added since the last accalloc_reset_accumulated_memory_stats.
   */
  int64_t allocated;
  /**
   * Total removed since the last accalloc_reset_accumulated_memory_stats.
   */
  int64_t freed;
} AccallocStat;

/**
 * Decides whether an allocation on `stream` goes to the pool (non-zero: it does).
 */
typedef int32_t (*AccallocPoolFilter)(void *stream, void *context);

/**
 * Releases a filter's context once its route has ended.
 */
typedef void (*AccallocPoolFilterRelease)(void *context);

/**
 * PyTorch's pluggable allocation function: `size` bytes on `device` for `stream`; NULL when it has
 * no room.
 */
typedef void *(*AccallocPluggableAlloc)(size_t size, int32_t device, void *stream);

/**
 * PyTorch's pluggable free function: give back what the allocation function returned.
 */
typedef void (*AccallocPluggableFree)(void *ptr, size_t size, int32_t device, void *stream);

/**
 * Every statistic of one device: PyTorch's DeviceStats. Arrays are indexed by ACCALLOC_STAT_ALL,
 * ACCALLOC_STAT_SMALL_POOL and ACCALLOC_STAT_LARGE_POOL.
 *
 * Set struct_size to sizeof(AccallocDeviceStats) before calling accalloc_get_device_stats: the library fills
 * that many bytes at most, so a program built against this header keeps working when later versions
 * add fields at the end.
 */
typedef struct AccallocDeviceStats {
  /**
   * Size of this struct as the caller knows it; set by the caller, rewritten with the bytes filled.
   */
  size_t struct_size;
  /**
   * Allocations handed out (count).
   */
  struct AccallocStat allocation[3];
  /**
   * Segments held from the device (count).
   */
  struct AccallocStat segment[3];
  /**
   * Blocks in use, including those freed but waiting on stream events (count).
   */
  struct AccallocStat active[3];
  /**
   * Free blocks that are part of a split segment (count).
   */
  struct AccallocStat inactive_split[3];
  /**
   * Bytes handed out (rounded sizes).
   */
  struct AccallocStat allocated_bytes[3];
  /**
   * Bytes of segments held from the device.
   */
  struct AccallocStat reserved_bytes[3];
  /**
   * Bytes of active blocks.
   */
  struct AccallocStat active_bytes[3];
  /**
   * Bytes of free blocks in split segments.
   */
  struct AccallocStat inactive_split_bytes[3];
  /**
   * Bytes the callers asked for (before rounding).
   */
  struct AccallocStat requested_bytes[3];
  /**
   * Allocations of at least max_split_size.
   */
  struct AccallocStat oversize_allocations;
  /**
   * Segments of at least max_split_size.
   */
  struct AccallocStat oversize_segments;
  /**
   * Retries after releasing cached memory on device out-of-memory.
   */
  int64_t num_alloc_retries;
  /**
   * Out-of-memory errors returned.
   */
  int64_t num_ooms;
  /**
   * Synchronizations of all streams (on retry and empty_cache).
   */
  int64_t num_sync_all_streams;
  /**
   * Segments asked of the device.
   */
  int64_t num_device_alloc;
  /**
   * Segments given back to the device.
   */
  int64_t num_device_free;
  /**
   * The configured max_split_size in bytes, -1 when unset.
   */
  int64_t max_split_size;
} AccallocDeviceStats;

/**
 * The host: memory from the operating system. Always available; the default without a GPU.
 */
#define ACCALLOC_DEVICE_HOST 0

/**
 * NVIDIA GPUs through the CUDA driver.
 */
#define ACCALLOC_DEVICE_CUDA 1

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * Free and total memory of `device` (-1: current), as the device reports them.
 */
enum AccallocStatus accalloc_mem_get_info(int32_t device, uint64_t *free, uint64_t *total);

/**
 * accalloc_mem_get_info on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_mem_get_info_on(AccallocDeviceType device_type,
                                             int32_t device,
                                             uint64_t *free,
                                             uint64_t *total);

/**
 * Limit the memory accalloc reserves on `device` to `fraction` (0 to 1) of its total memory;
 * a request past it fails as out of memory without asking the device.
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT for a fraction outside [0, 1] or NaN.
 */
enum AccallocStatus accalloc_set_memory_fraction(double fraction, int32_t device);

/**
 * accalloc_set_memory_fraction on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_set_memory_fraction_on(AccallocDeviceType device_type,
                                                    double fraction,
                                                    int32_t device);

/**
 * The fraction of its total memory accalloc may reserve on `device` (-1: this thread's current
 * device) of the current accelerator, in `*out`: what accalloc_set_memory_fraction (or the
 * per_process_memory_fraction setting) left, as PyTorch's torch.cuda.get_per_process_memory_fraction
 * reports it (the bytes allowed over the total); 1.0 when no fraction is set.
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (out is NULL), ACCALLOC_ERROR_INVALID_DEVICE.
 */
enum AccallocStatus accalloc_get_memory_fraction(double *out,
                                                 int32_t device);

/**
 * accalloc_get_memory_fraction on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_get_memory_fraction_on(AccallocDeviceType device_type,
                                                    double *out,
                                                    int32_t device);

/**
 * Number of devices of the current accelerator.
 */
enum AccallocStatus accalloc_device_count(int32_t *out);

/**
 * accalloc_device_count of the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_device_count_on(AccallocDeviceType device_type, int32_t *out);

/**
 * This thread's current device index (0 until accalloc_set_device is called).
 */
enum AccallocStatus accalloc_current_device(int32_t *out);

/**
 * accalloc_current_device of the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_current_device_on(AccallocDeviceType device_type, int32_t *out);

/**
 * Make `device` this thread's current device (what -1 means in other calls).
 */
enum AccallocStatus accalloc_set_device(int32_t device);

/**
 * accalloc_set_device on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_set_device_on(AccallocDeviceType device_type, int32_t device);

/**
 * The accelerator that calls without a device type use: ACCALLOC_DEVICE_CUDA when a GPU is present,
 * else ACCALLOC_DEVICE_HOST, until accalloc_set_accelerator chooses another.
 */
AccallocDeviceType accalloc_current_accelerator(void);

/**
 * Make `device_type` the accelerator of calls without a device type (process-wide).
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT when no such type exists.
 */
enum AccallocStatus accalloc_set_accelerator(AccallocDeviceType device_type);

/**
 * The name of a device type ("host", "cuda", or a registered backend's name), or "unknown".
 * Never NULL; valid for the life of the process.
 */
const char *accalloc_device_type_name(AccallocDeviceType device_type);

/**
 * Register an accelerator backend written in C and store its new device type in `*out`; every
 * function of this library then works on it (the `_on` forms, or after accalloc_set_accelerator), with
 * its own pools and statistics. `name` (1 to 64 letters, digits, '_' or '-') must be new. The table
 * is copied; its functions and context must stay valid for the life of the process.
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT for a NULL argument, a bad or taken name, a table whose
 * struct_size is wrong or whose required entries are NULL, or a device_count that fails.
 */
enum AccallocStatus accalloc_register_backend(const char *name,
                                              const struct AccallocBackendVTable *vtable,
                                              AccallocDeviceType *out);

/**
 * This thread's last failure message ("" before any). Never NULL; valid until this thread's next
 * failing call.
 */
const char *accalloc_last_error_message(void);

/**
 * The name of a status ("ACCALLOC_OK", "ACCALLOC_ERROR_OUT_OF_MEMORY", ...), "ACCALLOC_ERROR_UNKNOWN" for a value
 * that is not one. Never NULL; static storage.
 */
const char *accalloc_status_name(int32_t status);

/**
 * The library's version, "MAJOR.MINOR.PATCH". Static storage.
 */
const char *accalloc_version(void);

/**
 * The library's ABI version; a program should refuse a library whose value differs from the
 * ACCALLOC_ABI_VERSION it was built with.
 */
uint32_t accalloc_abi_version(void);

/**
 * Check that this library has the ABI a program was built for: pass the header's ACCALLOC_ABI_VERSION
 * (the ACCALLOC_CHECK_ABI() macro does). ACCALLOC_ERROR_NOT_SUPPORTED, with a message saying both versions,
 * when they differ: the program must not use this library.
 */
enum AccallocStatus accalloc_check_abi(uint32_t header_abi);

/**
 * The statistics of `device` (-1: current) as PyTorch's memory_summary() table; `abbreviated`
 * non-zero leaves out the per-pool rows. Written like accalloc_memory_stats_json: buf NULL asks for the
 * size, *len receives the bytes needed including the NUL.
 */
enum AccallocStatus accalloc_memory_summary(int32_t device,
                                            int32_t abbreviated,
                                            char *buf,
                                            size_t cap,
                                            size_t *len);

/**
 * accalloc_memory_summary on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_memory_summary_on(AccallocDeviceType device_type,
                                               int32_t device,
                                               int32_t abbreviated,
                                               char *buf,
                                               size_t cap,
                                               size_t *len);

/**
 * Every segment and block of every device of the current accelerator as one JSON object with the
 * fields of PyTorch's snapshot: {"segments": [...], "device_traces": [[...] per device],
 * "allocator_settings": {...}}. accalloc's own keys appear only where they say something: a
 * segment's "paused_size" (paused pages) and "planned_range" ([start, end) of it that the plan in
 * force spans, with planned_placement: on each segment the plan's range meets). Written like
 * accalloc_memory_stats_json.
 */
enum AccallocStatus accalloc_memory_snapshot_json(char *buf, size_t cap, size_t *len);

/**
 * accalloc_memory_snapshot_json of the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_memory_snapshot_json_on(AccallocDeviceType device_type,
                                                     char *buf,
                                                     size_t cap,
                                                     size_t *len);

/**
 * Start (`enabled` non-zero, keeping the newest `max_entries` per device) or stop recording the
 * history of allocator events (alloc, free_requested, free_completed, segment_alloc, segment_free,
 * segment_map, segment_unmap, oom) with microsecond times; the snapshot includes it as
 * device_traces. Starting again clears the history. Errors: ACCALLOC_ERROR_INVALID_ARGUMENT when enabling
 * with max_entries 0.
 */
enum AccallocStatus accalloc_record_memory_history(int32_t enabled,
                                                   size_t max_entries);

/**
 * accalloc_record_memory_history on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_record_memory_history_on(AccallocDeviceType device_type,
                                                      int32_t enabled,
                                                      size_t max_entries);

/**
 * Allocate at least `size` bytes on `device` (-1: this thread's current device) of the current
 * accelerator for use on `stream` (NULL: the default stream) and store the address in `*out`.
 * Blocks are 512-byte aligned and are reused only on the stream they were allocated on. Size 0
 * stores NULL and succeeds.
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (out is NULL), ACCALLOC_ERROR_INVALID_DEVICE,
 * ACCALLOC_ERROR_OUT_OF_MEMORY (message in PyTorch's "Tried to allocate" form). On error *out is not
 * touched.
 */
enum AccallocStatus accalloc_malloc(void **out,
                                    size_t size,
                                    int32_t device,
                                    void *stream);

/**
 * accalloc_malloc on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_malloc_on(AccallocDeviceType device_type,
                                       void **out,
                                       size_t size,
                                       int32_t device,
                                       void *stream);

/**
 * Return memory from accalloc_malloc (of any accelerator) to the cache. NULL is a no-op.
 *
 * Errors: ACCALLOC_ERROR_INVALID_POINTER for a pointer accalloc did not hand out, an interior pointer or
 * a double free; nothing is changed.
 */
enum AccallocStatus accalloc_free(void *ptr);

/**
 * The live allocation at `ptr` (of any accelerator): the bytes it holds as memory_allocated counts
 * them (the request rounded up by the allocator's rules) in `*size`, and where it lies in
 * `*device_type` and `*device` (each of these two may be NULL when not wanted). For profilers, which
 * are told each allocation's size when it is made and again when it is freed (PyTorch's
 * reportMemoryUsageToProfiler); not meant for a hot path.
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (size is NULL), ACCALLOC_ERROR_INVALID_POINTER when `ptr`
 * is not a live allocation. On error nothing is stored.
 */
enum AccallocStatus accalloc_allocation_info(const void *ptr,
                                             uint64_t *size,
                                             AccallocDeviceType *device_type,
                                             int32_t *device);

/**
 * Note that `stream` uses the allocation at `ptr` (PyTorch's record_stream): when it is freed, the
 * block returns to the cache only after the work queued on `stream` until then has completed.
 * Uses on the stream the block was allocated on are ignored.
 *
 * Errors: ACCALLOC_ERROR_INVALID_POINTER when `ptr` is not a live allocation; ACCALLOC_ERROR_NOT_SUPPORTED
 * when its backend has neither events nor stream synchronization.
 */
enum AccallocStatus accalloc_record_stream(void *ptr,
                                           void *stream);

/**
 * Release every unused cached segment of every device of the current accelerator back to the
 * device (torch.accelerator.empty_cache).
 */
enum AccallocStatus accalloc_empty_cache(void);

/**
 * accalloc_empty_cache on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_empty_cache_on(AccallocDeviceType device_type);

/**
 * Call `observer` with `user_data` for every segment event of every device from now on, and store
 * the handle that removes it in `*handle`. Observers are called in the order they were added.
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (observer or handle is NULL; called from inside an
 * observer).
 */
enum AccallocStatus accalloc_segment_observer_add(AccallocSegmentObserver observer,
                                                  void *user_data,
                                                  uint64_t *handle);

/**
 * Stop calling the segment observer of `handle`. When this returns the observer is not running
 * on any thread and is never called again, so its user data may be freed.
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (no such handle; called from inside an observer).
 */
enum AccallocStatus accalloc_segment_observer_remove(uint64_t handle);

/**
 * Call `observer` with `user_data` after every out-of-memory failure of every device from now on,
 * and store the handle that removes it in `*handle`.
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (observer or handle is NULL; called from inside an
 * observer).
 */
enum AccallocStatus accalloc_oom_observer_add(AccallocOomObserver observer,
                                              void *user_data,
                                              uint64_t *handle);

/**
 * Stop calling the OOM observer of `handle`; as accalloc_segment_observer_remove.
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (no such handle; called from inside an observer).
 */
enum AccallocStatus accalloc_oom_observer_remove(uint64_t handle);

/**
 * Make an ONNX Runtime allocator (an `OrtAllocator*`, stored in `*out_allocator`) whose memory comes
 * from `device` (-1: this thread's current device, fixed at this call) of the accelerator of
 * `device_type`, through accalloc's caching allocator on the default stream: ORT's tensors then show
 * in accalloc's statistics, memory_summary, snapshots and ACCALLOC_TRACE.
 *
 * `ort_api` is the `const OrtApi*` from `OrtGetApiBase()->GetApi(ort_api_version)`; it must stay valid
 * while the allocator lives. The allocator's version field is the lower of `ort_api_version` and the
 * version this library was built with (23), and it sets only the callbacks that version reads
 * (GetStats and AllocOnStream from 23). Its Info is "Cpu" memory (OrtDeviceAllocator,
 * OrtMemTypeDefault) for the host and registered backends, which must then be host-accessible, and
 * "Cuda" memory of the device's index for CUDA. GetStats answers ORT's AllocatorStats keys from this
 * device's books: Limit, InUse, RequestedInUse, TotalAllocated (reserved bytes), MaxInUse,
 * NumAllocs, NumReserves, NumArenaExtensions and NumArenaShrinkages (segments taken and given
 * back), MaxAllocSize. An allocation that fails throws a C++ std::runtime_error with accalloc's
 * message, as ORT's own allocators do, through the C++ runtime ORT loaded (NULL where none is
 * loaded): ORT makes it the error status of the call that allocated. The message also stays on the
 * failing thread's accalloc_last_error_message().
 *
 * Share it with `RegisterAllocator(env, allocator)` and the session config entry
 * "session.use_env_allocators" = "1". Destroy it with accalloc_ort_allocator_destroy once ORT no
 * longer uses it.
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (ort_api or out_allocator NULL, ort_api_version 0 or
 * above 1000, an unknown device type), ACCALLOC_ERROR_INVALID_DEVICE, ACCALLOC_ERROR_BACKEND (ORT
 * could not create the memory info), ACCALLOC_ERROR_NOT_SUPPORTED (built without ORT support). On
 * error *out_allocator is not touched.
 */
enum AccallocStatus accalloc_ort_allocator_create(const void *ort_api,
                                                  uint32_t ort_api_version,
                                                  AccallocDeviceType device_type,
                                                  int32_t device,
                                                  void **out_allocator);

/**
 * Destroy an allocator from accalloc_ort_allocator_create (NULL is a no-op). Call it only after ORT
 * stops using it (UnregisterAllocator, or the environment released) and after the sessions and
 * values holding its memory are released; memory still held stays allocated.
 *
 * Errors: ACCALLOC_ERROR_INVALID_POINTER for a pointer that is not a live allocator of
 * accalloc_ort_allocator_create (nothing is freed).
 */
enum AccallocStatus accalloc_ort_allocator_destroy(void *allocator);

/**
 * Allocate at least `size` bytes of pinned host memory from the current accelerator's host caching
 * allocator and store the address in `*out`: memory its devices copy from and to asynchronously.
 * The size is rounded up to a power of two; a cached block of that size is reused, the newest first,
 * once every stream that used it (accalloc_host_record_stream) has finished the work queued before
 * its free. Size 0 stores NULL and succeeds. The host backend page-locks the memory where the system
 * allows it (RLIMIT_MEMLOCK) and hands out ordinary memory where not: the statistic
 * page_locked_bytes tells which.
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (out is NULL); ACCALLOC_ERROR_OUT_OF_MEMORY (after giving
 * the cached blocks back and trying again); ACCALLOC_ERROR_NOT_SUPPORTED where the accelerator's
 * backend has no pinned host memory (a registered backend without host_alloc and host_free); on
 * error *out is not touched.
 */
enum AccallocStatus accalloc_host_malloc(void **out,
                                         size_t size);

/**
 * accalloc_host_malloc from the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_host_malloc_on(AccallocDeviceType device_type,
                                            void **out,
                                            size_t size);

/**
 * Give back memory from accalloc_host_malloc (of any accelerator). NULL is a no-op. The block is
 * reused once the streams recorded on it have finished the work queued until now.
 *
 * Errors: ACCALLOC_ERROR_INVALID_POINTER for a pointer that is not from accalloc_host_malloc, an
 * interior pointer or a double free (nothing changes); ACCALLOC_ERROR_BACKEND where a stream's use
 * could be neither recorded as an event nor waited for: the block stays handed out, the events made
 * for it are destroyed, and the free may be retried (as accalloc_free's).
 */
enum AccallocStatus accalloc_host_free(void *ptr);

/**
 * Note that `stream` of `device` (-1: the current device of the accelerator the memory is from)
 * uses the pinned block that `ptr` lies in (any address inside it), as PyTorch's
 * CachingHostAllocator_recordEvent does after a non-blocking copy: its reuse after
 * accalloc_host_free waits for the work queued on `stream` until that free. `*out_recorded`
 * (may be NULL) is false where `ptr` is not pinned memory from accalloc: nothing to record, not an
 * error, as PyTorch calls this for every tensor of a non-blocking copy.
 *
 * Errors: ACCALLOC_ERROR_INVALID_POINTER (the block is not handed out), ACCALLOC_ERROR_INVALID_DEVICE,
 * ACCALLOC_ERROR_NOT_SUPPORTED (the backend has neither events nor stream synchronization).
 */
enum AccallocStatus accalloc_host_record_stream(const void *ptr,
                                                int32_t device,
                                                void *stream,
                                                bool *out_recorded);

/**
 * Store in `*out` whether `ptr` lies in pinned host memory from accalloc_host_malloc (of any
 * accelerator, handed out or cached): PyTorch's isPinnedPtr.
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (out is NULL).
 */
enum AccallocStatus accalloc_host_is_pinned(const void *ptr, bool *out);

/**
 * Give every cached pinned block of the current accelerator whose streams have finished back to
 * the system (torch.accelerator.empty_host_cache). Blocks handed out stay.
 *
 * Errors: ACCALLOC_ERROR_BACKEND where the backend refused to free a block (it stays cached and
 * counted; the others are still given back); ACCALLOC_ERROR_NOT_SUPPORTED as accalloc_host_malloc.
 */
enum AccallocStatus accalloc_host_empty_cache(void);

/**
 * accalloc_host_empty_cache on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_host_empty_cache_on(AccallocDeviceType device_type);

/**
 * Write the current accelerator's pinned host statistics as one JSON object plus a NUL, with
 * torch.cuda.host_memory_stats()'s keys, sorted: allocations, allocated_bytes, active_requests and
 * active_bytes (each .current/.peak/.allocated/.freed; the active peaks summed per power of two, as
 * PyTorch does), num_host_alloc, num_host_free, host_alloc_time and host_free_time
 * (.total/.max/.min/.count/.avg, microseconds), and accalloc's page_locked_bytes. `*len` receives
 * the bytes needed including the NUL; with buf NULL this only sets *len; with cap too small it
 * returns ACCALLOC_ERROR_BUFFER_TOO_SMALL and leaves buf untouched.
 */
enum AccallocStatus accalloc_host_memory_stats_json(char *buf, size_t cap, size_t *len);

/**
 * accalloc_host_memory_stats_json on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_host_memory_stats_json_on(AccallocDeviceType device_type,
                                                       char *buf,
                                                       size_t cap,
                                                       size_t *len);

/**
 * Store one pinned host statistic of the current accelerator, by its key in
 * accalloc_host_memory_stats_json (e.g. "allocated_bytes.current", "num_host_alloc"), in `*out`.
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (a NULL argument or an unknown key).
 */
enum AccallocStatus accalloc_host_memory_stat(const char *key, int64_t *out);

/**
 * accalloc_host_memory_stat on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_host_memory_stat_on(AccallocDeviceType device_type,
                                                 const char *key,
                                                 int64_t *out);

/**
 * Set the running totals (.allocated, .freed, num_host_alloc, num_host_free) and the timing sums
 * of the current accelerator's pinned host statistics to 0
 * (torch.cuda.reset_accumulated_host_memory_stats).
 */
enum AccallocStatus accalloc_host_reset_accumulated_memory_stats(void);

/**
 * accalloc_host_reset_accumulated_memory_stats on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_host_reset_accumulated_memory_stats_on(AccallocDeviceType device_type);

/**
 * Set every peak of the current accelerator's pinned host statistics to its current value, and
 * the timing extremes to 0 (torch.cuda.reset_peak_host_memory_stats).
 */
enum AccallocStatus accalloc_host_reset_peak_memory_stats(void);

/**
 * accalloc_host_reset_peak_memory_stats on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_host_reset_peak_memory_stats_on(AccallocDeviceType device_type);

/**
 * Fill `*out` with what planned_placement's planner has done on `device` (-1: current).
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (out NULL or struct_size too small),
 * ACCALLOC_ERROR_INVALID_DEVICE.
 */
enum AccallocStatus accalloc_planner_stats(int32_t device, struct AccallocPlannerStats *out);

/**
 * accalloc_planner_stats on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_planner_stats_on(AccallocDeviceType device_type,
                                              int32_t device,
                                              struct AccallocPlannerStats *out);

/**
 * Allocate `size` bytes on `device` for `stream` (a cudaStream_t); NULL on failure, with the
 * reason written to standard error and kept in accalloc_last_error_message().
 */
void *accalloc_pluggable_malloc(size_t size, int32_t device, void *stream);

/**
 * Free what accalloc_pluggable_malloc returned (`size`, `device` and `stream` are as PyTorch passes them;
 * accalloc knows them already).
 */
void accalloc_pluggable_free(void *ptr,
                             size_t _size,
                             int32_t _device,
                             void *_stream);

/**
 * PyTorch's init hook: accalloc initialises itself on first use, so this only checks that it can.
 */
void accalloc_pluggable_init(int32_t _device_count);

/**
 * PyTorch's reset hook, called by torch.cuda.empty_cache().
 */
void accalloc_pluggable_empty_cache(void);

/**
 * PyTorch's memory_fraction hook, called by torch.cuda.set_per_process_memory_fraction().
 */
void accalloc_pluggable_set_memory_fraction(double fraction, int32_t device);

/**
 * PyTorch's record_stream hook, called by Tensor.record_stream().
 */
void accalloc_pluggable_record_stream(void *ptr, void *stream);

/**
 * Take a checkpoint of `pool` on `device` into `*out`: accalloc_pool_checkpoint_on on the current
 * accelerator.
 */
enum AccallocStatus accalloc_pool_checkpoint(int32_t device,
                                             struct AccallocPoolId pool,
                                             struct AccallocPoolCheckpoint **out);

/**
 * Take a checkpoint of `pool` on `device` of the accelerator of `device_type` into `*out`, to put
 * back later with accalloc_pool_checkpoint_restore (PyTorch's getCheckpointState). Nothing in the
 * pool changes.
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (out is NULL; the pool does not exist, is paused, or has
 * a freed block still waiting for another stream's work: synchronize first),
 * ACCALLOC_ERROR_INVALID_DEVICE.
 */
enum AccallocStatus accalloc_pool_checkpoint_on(AccallocDeviceType device_type,
                                                int32_t device,
                                                struct AccallocPoolId pool,
                                                struct AccallocPoolCheckpoint **out);

/**
 * Store in `*count` how many blocks `checkpoint` holds as handed out: how many
 * accalloc_pool_checkpoint_restore hands out again.
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (checkpoint or count is NULL).
 */
enum AccallocStatus accalloc_pool_checkpoint_allocations(const struct AccallocPoolCheckpoint *checkpoint,
                                                         size_t *count);

/**
 * Put `checkpoint` back into its pool (PyTorch's setCheckpointPoolState): the pool's live
 * allocations are freed, and the blocks handed out at the checkpoint are handed out again at their
 * addresses, now the caller's to free. Statistics move as PyTorch's: the frees, then each
 * checkpointed block handed out (its size asked for) and those free at the checkpoint freed again;
 * no segment is taken or given back.
 *
 * The addresses freed go to `freed` (room for `freed_capacity`; their number to `*freed_count`), the
 * blocks handed out to `allocated` and their sizes to `allocated_sizes` (room for
 * `allocated_capacity` each; their number to `*allocated_count`). An address may be in both lists.
 * With accalloc_pool_live_allocations_on and accalloc_pool_checkpoint_allocations the caller knows
 * the room needed; with too little, nothing changes.
 *
 * Refused with nothing changed, ACCALLOC_ERROR_INVALID_ARGUMENT: a required pointer is NULL (an
 * array may be NULL with a capacity of 0), too little room, the pool is gone, released (no use
 * left) or paused, one of its blocks is used by or waits for another stream (synchronize and free it
 * first), or a checkpointed segment is no longer the pool's as it was. ACCALLOC_ERROR_INVALID_DEVICE.
 */
enum AccallocStatus accalloc_pool_checkpoint_restore(const struct AccallocPoolCheckpoint *checkpoint,
                                                     void **freed,
                                                     size_t freed_capacity,
                                                     size_t *freed_count,
                                                     void **allocated,
                                                     size_t *allocated_sizes,
                                                     size_t allocated_capacity,
                                                     size_t *allocated_count);

/**
 * Free a checkpoint accalloc_pool_checkpoint_on made (NULL: nothing to do). Its pool is not
 * touched.
 */
enum AccallocStatus accalloc_pool_checkpoint_destroy(struct AccallocPoolCheckpoint *checkpoint);

/**
 * Make a private pool on `device` (-1: current) of the current accelerator, with one use, and
 * store its id ({0, n}, n counting from 1 in the process) in `*out`. `use_on_oom` non-zero: a
 * default-pool request about to fail may take one of its free blocks. `no_split` non-zero: its
 * blocks are never split (a request gets a whole free block or segment; stays set once set).
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (out is NULL), ACCALLOC_ERROR_INVALID_DEVICE.
 */
enum AccallocStatus accalloc_pool_create(int32_t device,
                                         int32_t use_on_oom,
                                         int32_t no_split,
                                         struct AccallocPoolId *out);

/**
 * accalloc_pool_create on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_pool_create_on(AccallocDeviceType device_type,
                                            int32_t device,
                                            int32_t use_on_oom,
                                            int32_t no_split,
                                            struct AccallocPoolId *out);

/**
 * accalloc_pool_create for a pool whose segments come from `allocator` (PyTorch's
 * MemPool(allocator=...)): its raw_alloc and raw_free (required; raw_alloc answers
 * ACCALLOC_BACKEND_OUT_OF_MEMORY when it has no room, which is the pool's out of memory: the device
 * is not asked), and its virtual-memory group when all five entries are there, for expandable
 * segments inside the pool (without it, the pool's segments are ordinary ones). The other entries
 * are not used and may be NULL: the device's backend answers for events, streams and memory
 * figures. The table is copied; its functions and context must stay valid, and usable from any
 * thread, until the pool is gone and every segment it held was given back. Its functions run as
 * callbacks of the device type: calling accalloc for it from them is refused. What they hand out
 * is checked as a registered backend's is (NULL, alignment, overlap: refused and given back).
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (allocator or out is NULL; the table's struct_size is
 * too small; raw_alloc or raw_free is NULL), ACCALLOC_ERROR_INVALID_DEVICE; nothing is made.
 */
enum AccallocStatus accalloc_pool_create_with_allocator(int32_t device,
                                                        int32_t use_on_oom,
                                                        int32_t no_split,
                                                        const struct AccallocBackendVTable *allocator,
                                                        struct AccallocPoolId *out);

/**
 * accalloc_pool_create_with_allocator on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_pool_create_with_allocator_on(AccallocDeviceType device_type,
                                                           int32_t device,
                                                           int32_t use_on_oom,
                                                           int32_t no_split,
                                                           const struct AccallocBackendVTable *allocator,
                                                           struct AccallocPoolId *out);

/**
 * From now until accalloc_pool_end, allocations on `device` go to `pool`: those of the calling
 * thread (`route` ACCALLOC_ROUTE_THREAD; `stream` ignored) or those on `stream`
 * (ACCALLOC_ROUTE_STREAM). Counts a use of the pool, making it (with one use) if it does not
 * exist. Pools begun at once nest: a request goes to the newest whose route takes it. While a pool
 * is begun for a stream (a capture), the device's allocations process no finished events and
 * skip the last-resort release of every cached segment, and accalloc_empty_cache leaves the
 * default pools alone, as PyTorch 2.15 does during a capture (not for use_mem_pool's thread
 * route).
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (the pool is begun already; {0, 0}; an unknown route),
 * ACCALLOC_ERROR_INVALID_DEVICE; nothing changes.
 */
enum AccallocStatus accalloc_pool_begin(int32_t device,
                                        struct AccallocPoolId pool,
                                        int32_t route,
                                        void *stream);

/**
 * accalloc_pool_begin on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_pool_begin_on(AccallocDeviceType device_type,
                                           int32_t device,
                                           struct AccallocPoolId pool,
                                           int32_t route,
                                           void *stream);

/**
 * Allocations stop going to `pool` (its use count is unchanged: release it when done).
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (the pool is not begun), ACCALLOC_ERROR_INVALID_DEVICE.
 */
enum AccallocStatus accalloc_pool_end(int32_t device, struct AccallocPoolId pool);

/**
 * accalloc_pool_end on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_pool_end_on(AccallocDeviceType device_type,
                                         int32_t device,
                                         struct AccallocPoolId pool);

/**
 * One use of `pool` less (a creation's or a begin's). At none the pool is freeable: nothing is
 * freed now, its blocks still return to it when freed, and accalloc_empty_cache gives back its
 * free segments and forgets it once it holds none.
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (no such pool, or no use left), ACCALLOC_ERROR_INVALID_DEVICE.
 */
enum AccallocStatus accalloc_pool_release(int32_t device,
                                          struct AccallocPoolId pool);

/**
 * accalloc_pool_release on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_pool_release_on(AccallocDeviceType device_type,
                                             int32_t device,
                                             struct AccallocPoolId pool);

/**
 * Give back the free whole segments of `pool`. With `live` zero this is PyTorch's
 * emptyCache(pool): only a freeable pool (no use left) is emptied, and a live or unknown pool is
 * left alone. With `live` non-zero, accalloc's own, the free segments of a live pool go back too
 * (PyTorch keeps them reserved for as long as the pool lives: pytorch#159674).
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (`live` non-zero and no such pool),
 * ACCALLOC_ERROR_INVALID_DEVICE, ACCALLOC_ERROR_BACKEND (a segment the backend refused to free
 * stays, counted).
 */
enum AccallocStatus accalloc_pool_empty_cache(int32_t device,
                                              struct AccallocPoolId pool,
                                              int32_t live);

/**
 * accalloc_pool_empty_cache on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_pool_empty_cache_on(AccallocDeviceType device_type,
                                                 int32_t device,
                                                 struct AccallocPoolId pool,
                                                 int32_t live);

/**
 * Store `pool`'s use count in `*use_count` and the segments it holds in `*segments` (either may be
 * NULL); both -1 where the pool does not exist (never made, or emptied and forgotten).
 *
 * Errors: ACCALLOC_ERROR_INVALID_DEVICE.
 */
enum AccallocStatus accalloc_pool_info(int32_t device,
                                       struct AccallocPoolId pool,
                                       int64_t *use_count,
                                       int64_t *segments);

/**
 * accalloc_pool_info on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_pool_info_on(AccallocDeviceType device_type,
                                          int32_t device,
                                          struct AccallocPoolId pool,
                                          int64_t *use_count,
                                          int64_t *segments);

/**
 * The addresses of `pool`'s live allocations (handed out and not yet freed; a freed block still
 * waiting for a stream's event is not live), ascending: the first `capacity` of them are written to
 * `out` (which may be NULL when `capacity` is 0) and how many there are to `*count`, so that a
 * caller can ask for the count first. CUDA graph trees check a graph pool with it (PyTorch's
 * checkPoolLiveAllocations: are the live allocations exactly the tensors the tree holds?).
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (count is NULL, out is NULL with a capacity, or the pool
 * does not exist; nothing is written), ACCALLOC_ERROR_INVALID_DEVICE.
 */
enum AccallocStatus accalloc_pool_live_allocations(int32_t device,
                                                   struct AccallocPoolId pool,
                                                   void **out,
                                                   size_t capacity,
                                                   size_t *count);

/**
 * accalloc_pool_live_allocations on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_pool_live_allocations_on(AccallocDeviceType device_type,
                                                      int32_t device,
                                                      struct AccallocPoolId pool,
                                                      void **out,
                                                      size_t capacity,
                                                      size_t *count);

/**
 * Store `pool`'s share of reserved_bytes (PyTorch's reserved_bytes_by_private_pools: its segments
 * and mapped pages) for all, the small pool and the large pool in `*all`, `*small_pool` and
 * `*large_pool` (any may be NULL). It moves with every segment and page of the pool as
 * reserved_bytes does, and the resets reset it.
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (the pool does not exist; nothing is written),
 * ACCALLOC_ERROR_INVALID_DEVICE.
 */
enum AccallocStatus accalloc_pool_reserved_bytes(int32_t device,
                                                 struct AccallocPoolId pool,
                                                 struct AccallocStat *all,
                                                 struct AccallocStat *small_pool,
                                                 struct AccallocStat *large_pool);

/**
 * accalloc_pool_reserved_bytes on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_pool_reserved_bytes_on(AccallocDeviceType device_type,
                                                    int32_t device,
                                                    struct AccallocPoolId pool,
                                                    struct AccallocStat *all,
                                                    struct AccallocStat *small_pool,
                                                    struct AccallocStat *large_pool);

/**
 * One more use of `pool` on `device` (made with one use if it does not exist): PyTorch's
 * createOrIncrefPool, for a framework that hands out pool ids itself (its MemPool, its graphs).
 * Such ids may meet accalloc_pool_create's {0, n}: a framework uses one or the other.
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT ({0, 0}), ACCALLOC_ERROR_INVALID_DEVICE.
 */
enum AccallocStatus accalloc_pool_retain(int32_t device, struct AccallocPoolId pool);

/**
 * accalloc_pool_retain on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_pool_retain_on(AccallocDeviceType device_type,
                                            int32_t device,
                                            struct AccallocPoolId pool);

/**
 * Set `pool`'s flags, as PyTorch's setUseOnOOM and setNoSplit: `use_on_oom` 0 or 1 as given, a
 * negative value leaves it; `no_split` non-zero sets it (it stays set).
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (no such pool), ACCALLOC_ERROR_INVALID_DEVICE.
 */
enum AccallocStatus accalloc_pool_set_flags(int32_t device,
                                            struct AccallocPoolId pool,
                                            int32_t use_on_oom,
                                            int32_t no_split);

/**
 * accalloc_pool_set_flags on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_pool_set_flags_on(AccallocDeviceType device_type,
                                               int32_t device,
                                               struct AccallocPoolId pool,
                                               int32_t use_on_oom,
                                               int32_t no_split);

/**
 * accalloc_pool_begin with a filter of the caller's, as PyTorch's beginAllocateToPool takes one (a
 * CUDA graph's test of the stream's capture id): until accalloc_pool_end, each allocation on
 * `device` whose stream `filter(stream, context)` accepts goes to `pool`. The filter runs with the
 * device held, from the allocating thread: it must be quick and may not call accalloc for this
 * device type. `capture` non-zero: the route is a graph capture, and the capture rules hold while
 * it is begun (no event processing, no last-resort release, stream-used frees deferred). `release`
 * (may be NULL) is called with `context` once the route has ended (after the device is let go),
 * or at once when the begin fails.
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (filter is NULL; the pool is begun already; {0, 0}),
 * ACCALLOC_ERROR_INVALID_DEVICE; nothing changes.
 */
enum AccallocStatus accalloc_pool_begin_filtered(int32_t device,
                                                 struct AccallocPoolId pool,
                                                 AccallocPoolFilter filter,
                                                 void *context,
                                                 AccallocPoolFilterRelease release,
                                                 int32_t capture);

/**
 * accalloc_pool_begin_filtered on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_pool_begin_filtered_on(AccallocDeviceType device_type,
                                                    int32_t device,
                                                    struct AccallocPoolId pool,
                                                    AccallocPoolFilter filter,
                                                    void *context,
                                                    AccallocPoolFilterRelease release,
                                                    int32_t capture);

/**
 * accalloc_pool_create_with_allocator for an allocator in PyTorch's pluggable form (the two
 * functions torch.cuda.memory.CUDAPluggableAllocator loads from a library: `void *alloc(size_t size,
 * int device, void *stream)`, NULL when it has no room, and `void free(void *ptr, size_t size, int
 * device, void *stream)`), as MemPool(allocator=CUDAPluggableAllocator(...)) takes it. The pool's
 * segments are ordinary ones (the pair has no virtual memory). The functions must stay valid, and
 * usable from any thread, until the pool is gone.
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (a function or out is NULL),
 * ACCALLOC_ERROR_INVALID_DEVICE; nothing is made.
 */
enum AccallocStatus accalloc_pool_create_with_functions(int32_t device,
                                                        int32_t use_on_oom,
                                                        int32_t no_split,
                                                        AccallocPluggableAlloc alloc,
                                                        AccallocPluggableFree free,
                                                        struct AccallocPoolId *out);

/**
 * accalloc_pool_create_with_functions on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_pool_create_with_functions_on(AccallocDeviceType device_type,
                                                           int32_t device,
                                                           int32_t use_on_oom,
                                                           int32_t no_split,
                                                           AccallocPluggableAlloc alloc,
                                                           AccallocPluggableFree free,
                                                           struct AccallocPoolId *out);

/**
 * Change the current accelerator's allocator settings, in PYTORCH_ALLOC_CONF's syntax (the same as
 * the ACCALLOC_CONF environment variable), e.g.
 * "max_split_size_mb:128,roundup_power2_divisions:[64:8,>:1]". max_split_size_mb,
 * roundup_power2_divisions and garbage_collection_threshold return to their defaults unless named;
 * other keys keep their values. Errors: ACCALLOC_ERROR_CONFIG with a message naming the key, the value
 * and what is allowed; the settings in force stay as they were.
 */
enum AccallocStatus accalloc_set_allocator_settings(const char *conf);

/**
 * accalloc_set_allocator_settings on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_set_allocator_settings_on(AccallocDeviceType device_type,
                                                       const char *conf);

/**
 * The settings in force as a configuration string ("" for the defaults), written like
 * accalloc_memory_stats_json: buf NULL asks for the size, *len receives the bytes needed including the NUL.
 */
enum AccallocStatus accalloc_get_allocator_settings(char *buf,
                                                    size_t cap,
                                                    size_t *len);

/**
 * accalloc_get_allocator_settings of the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_get_allocator_settings_on(AccallocDeviceType device_type,
                                                       char *buf,
                                                       size_t cap,
                                                       size_t *len);

/**
 * Make `pool` sleepable: its segments grow as expandable ones (pages that can be unmapped and
 * mapped again at the same addresses) whatever `expandable_segments` says. Call it before the pool
 * allocates.
 *
 * Errors: ACCALLOC_ERROR_NOT_SUPPORTED (the pool's memory has no virtual memory; the message names
 * the backend), ACCALLOC_ERROR_INVALID_ARGUMENT (no such pool; it holds ordinary segments already),
 * ACCALLOC_ERROR_INVALID_DEVICE; nothing changes.
 */
enum AccallocStatus accalloc_pool_set_sleepable(int32_t device, struct AccallocPoolId pool);

/**
 * accalloc_pool_set_sleepable on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_pool_set_sleepable_on(AccallocDeviceType device_type,
                                                   int32_t device,
                                                   struct AccallocPoolId pool);

/**
 * Pause a sleepable `pool`: the memory behind each of its mapped pages goes back to the device
 * (accalloc_mem_get_info's free rises by accalloc_pool_paused_bytes), the addresses stay reserved,
 * and with `backup` non-zero the contents are first copied to host memory. Every statistic stays:
 * its blocks are still allocated or free as they were. Until accalloc_pool_resume, an allocation
 * routed to the pool fails with ACCALLOC_ERROR_INVALID_ARGUMENT (its blocks may be freed), and its
 * memory must not be touched. Work queued on the pool's memory must be finished first. Pausing a
 * paused pool does nothing. A failure half way puts back the pages this call paused.
 *
 * Errors: ACCALLOC_ERROR_NOT_SUPPORTED (no virtual memory; a backup where the backend has no
 * copies to host memory: the message says which), ACCALLOC_ERROR_INVALID_ARGUMENT (no such pool;
 * not sleepable), ACCALLOC_ERROR_BACKEND, ACCALLOC_ERROR_INVALID_DEVICE.
 */
enum AccallocStatus accalloc_pool_pause(int32_t device, struct AccallocPoolId pool, int32_t backup);

/**
 * accalloc_pool_pause on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_pool_pause_on(AccallocDeviceType device_type,
                                           int32_t device,
                                           struct AccallocPoolId pool,
                                           int32_t backup);

/**
 * Resume a paused `pool`: new memory at the same addresses, and the backup copied back (without
 * one, the contents are undefined). Resuming a running pool does nothing. When the device has no
 * room (ACCALLOC_ERROR_OUT_OF_MEMORY) or a call fails (ACCALLOC_ERROR_BACKEND), the pages resumed so
 * far stay resumed and the rest paused: call it again.
 *
 * Errors: as accalloc_pool_pause.
 */
enum AccallocStatus accalloc_pool_resume(int32_t device,
                                         struct AccallocPoolId pool);

/**
 * accalloc_pool_resume on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_pool_resume_on(AccallocDeviceType device_type,
                                            int32_t device,
                                            struct AccallocPoolId pool);

/**
 * Store in `*out` the bytes of `pool` paused now (-1 where the pool does not exist).
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (out is NULL), ACCALLOC_ERROR_INVALID_DEVICE.
 */
enum AccallocStatus accalloc_pool_paused_bytes(int32_t device,
                                               struct AccallocPoolId pool,
                                               int64_t *out);

/**
 * accalloc_pool_paused_bytes on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_pool_paused_bytes_on(AccallocDeviceType device_type,
                                                  int32_t device,
                                                  struct AccallocPoolId pool,
                                                  int64_t *out);

/**
 * Store in `*out` the sleepable pool whose paused memory the `size` bytes at `ptr` on `device`
 * touch, or {0, 0} when none of them is paused: a framework checks a kernel's arguments with it
 * before touching them (their memory went back to the device at the pause). Until the first
 * pause on this accelerator it costs a load; after that, the device's lock and a lookup.
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (out is NULL), ACCALLOC_ERROR_INVALID_DEVICE.
 */
enum AccallocStatus accalloc_pool_paused_at(int32_t device,
                                            const void *ptr,
                                            size_t size,
                                            struct AccallocPoolId *out);

/**
 * accalloc_pool_paused_at on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_pool_paused_at_on(AccallocDeviceType device_type,
                                               int32_t device,
                                               const void *ptr,
                                               size_t size,
                                               struct AccallocPoolId *out);

/**
 * Fill `*out` with every statistic of `device` (-1: current). Set out->struct_size to
 * sizeof(AccallocDeviceStats) first; on return it holds the number of bytes filled.
 *
 * Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (out NULL or struct_size too small), ACCALLOC_ERROR_INVALID_DEVICE.
 */
enum AccallocStatus accalloc_get_device_stats(int32_t device,
                                              struct AccallocDeviceStats *out);

/**
 * accalloc_get_device_stats on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_get_device_stats_on(AccallocDeviceType device_type,
                                                 int32_t device,
                                                 struct AccallocDeviceStats *out);

/**
 * Bytes handed out now on `device` (memory_stats "allocated_bytes.all.current").
 */
enum AccallocStatus accalloc_memory_allocated(int32_t device, int64_t *out);

/**
 * accalloc_memory_allocated on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_memory_allocated_on(AccallocDeviceType device_type,
                                                 int32_t device,
                                                 int64_t *out);

/**
 * Peak of bytes handed out ("allocated_bytes.all.peak").
 */
enum AccallocStatus accalloc_max_memory_allocated(int32_t device, int64_t *out);

/**
 * accalloc_max_memory_allocated on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_max_memory_allocated_on(AccallocDeviceType device_type,
                                                     int32_t device,
                                                     int64_t *out);

/**
 * Bytes held from the device now, in use or cached ("reserved_bytes.all.current").
 */
enum AccallocStatus accalloc_memory_reserved(int32_t device, int64_t *out);

/**
 * accalloc_memory_reserved on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_memory_reserved_on(AccallocDeviceType device_type,
                                                int32_t device,
                                                int64_t *out);

/**
 * Peak of bytes held from the device ("reserved_bytes.all.peak").
 */
enum AccallocStatus accalloc_max_memory_reserved(int32_t device, int64_t *out);

/**
 * accalloc_max_memory_reserved on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_max_memory_reserved_on(AccallocDeviceType device_type,
                                                    int32_t device,
                                                    int64_t *out);

/**
 * Zero the "allocated" and "freed" totals of every statistic and the five event counters.
 */
enum AccallocStatus accalloc_reset_accumulated_memory_stats(int32_t device);

/**
 * accalloc_reset_accumulated_memory_stats on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_reset_accumulated_memory_stats_on(AccallocDeviceType device_type,
                                                               int32_t device);

/**
 * Set every peak to its current value.
 */
enum AccallocStatus accalloc_reset_peak_memory_stats(int32_t device);

/**
 * accalloc_reset_peak_memory_stats on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_reset_peak_memory_stats_on(AccallocDeviceType device_type,
                                                        int32_t device);

/**
 * Read one statistic by its memory_stats() key, e.g. "reserved_bytes.large_pool.peak" or
 * "num_ooms". Errors: ACCALLOC_ERROR_INVALID_ARGUMENT for a NULL or unknown key.
 */
enum AccallocStatus accalloc_memory_stat(int32_t device, const char *key, int64_t *out);

/**
 * accalloc_memory_stat on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_memory_stat_on(AccallocDeviceType device_type,
                                            int32_t device,
                                            const char *key,
                                            int64_t *out);

/**
 * Write every statistic of `device` as one JSON object with PyTorch's 122 keys, sorted, plus a NUL.
 * `*len` receives the bytes needed including the NUL. With buf NULL this only sets *len; with cap too
 * small it returns ACCALLOC_ERROR_BUFFER_TOO_SMALL and leaves buf untouched.
 */
enum AccallocStatus accalloc_memory_stats_json(int32_t device,
                                               char *buf,
                                               size_t cap,
                                               size_t *len);

/**
 * accalloc_memory_stats_json on the accelerator of `device_type`.
 */
enum AccallocStatus accalloc_memory_stats_json_on(AccallocDeviceType device_type,
                                                  int32_t device,
                                                  char *buf,
                                                  size_t cap,
                                                  size_t *len);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* ACCALLOC_H */
