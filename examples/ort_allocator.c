/* ONNX Runtime allocating through accalloc: the sessions of an ORT environment take their CPU tensors
 * from accalloc's caching allocator, so accalloc's statistics, memory_summary, snapshots and
 * ACCALLOC_TRACE cover them. See docs/ORT.md.
 *
 * This example compiles only where ONNX Runtime's C API header (onnxruntime_c_api.h) is installed: it
 * comes with an ORT release or package, not with accalloc, and is not in this repository.
 *
 *   cargo build --release
 *   cc -std=c99 -Iinclude -I$ORT/include examples/ort_allocator.c -Ltarget/release -laccalloc \
 *      -L$ORT/lib -lonnxruntime -Wl,-rpath,$PWD/target/release:$ORT/lib -o ort_allocator
 *   ./ort_allocator model.onnx
 */
#include <stdio.h>

#include <onnxruntime_c_api.h>

#include "accalloc.h"

#define ORT_CHECK(call)                                                        \
    do {                                                                       \
        OrtStatus *status_ = (call);                                           \
        if (status_ != NULL) {                                                 \
            fprintf(stderr, "%s: %s\n", #call, ort->GetErrorMessage(status_)); \
            ort->ReleaseStatus(status_);                                       \
            return 1;                                                          \
        }                                                                      \
    } while (0)

#define ACCALLOC_CHECK(call)                                                      \
    do {                                                                          \
        if ((call) != ACCALLOC_OK) {                                              \
            fprintf(stderr, "%s: %s\n", #call, accalloc_last_error_message());    \
            return 1;                                                             \
        }                                                                         \
    } while (0)

int main(int argc, char **argv) {
    const OrtApi *ort = OrtGetApiBase()->GetApi(ORT_API_VERSION);
    OrtEnv *env = NULL;
    OrtSessionOptions *options = NULL;
    OrtSession *session = NULL;
    OrtAllocator *allocator = NULL;
    static char summary[16384];
    size_t len = 0;

    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.onnx\n", argv[0]);
        return 2;
    }
    ORT_CHECK(ort->CreateEnv(ORT_LOGGING_LEVEL_WARNING, "accalloc-example", &env));

    /* The essential part: one accalloc allocator (host device 0) shared by the environment's sessions. */
    ACCALLOC_CHECK(accalloc_ort_allocator_create(ort, ORT_API_VERSION, ACCALLOC_DEVICE_HOST, 0,
                                                 (void **)&allocator));
    ORT_CHECK(ort->RegisterAllocator(env, allocator));
    ORT_CHECK(ort->CreateSessionOptions(&options));
    ORT_CHECK(ort->AddSessionConfigEntry(options, "session.use_env_allocators", "1"));
    ORT_CHECK(ort->DisableCpuMemArena(options)); /* accalloc caches already: no second arena */
    ORT_CHECK(ort->CreateSession(env, argv[1], options, &session));

    /* Run the session as usual; its weights are accalloc blocks already. */
    ACCALLOC_CHECK(accalloc_memory_summary_on(ACCALLOC_DEVICE_HOST, 0, 1, summary, sizeof summary, &len));
    puts(summary);

    ort->ReleaseSession(session);
    ort->ReleaseSessionOptions(options);
    ORT_CHECK(ort->UnregisterAllocator(env, allocator->Info(allocator)));
    ort->ReleaseEnv(env);
    ACCALLOC_CHECK(accalloc_ort_allocator_destroy(allocator));
    return 0;
}
