//! ACCALLOC_DEVICE=host keeps CUDA out of the process: a call that names CUDA's device type fails
//! and says why, rather than only that the type does not exist (as a user who set the variable for
//! tests and then called accalloc.torch.use_for_cuda on a GPU machine saw).

use accalloc::capi::device::accalloc_device_count_on;
use accalloc::capi::info::accalloc_last_error_message;
use accalloc::capi::AccallocStatus;
use std::ffi::CStr;

#[test]
fn a_call_on_cuda_with_cuda_forced_off_names_the_setting() {
    std::env::set_var("ACCALLOC_DEVICE", "host");
    let cuda = 1; // ACCALLOC_DEVICE_CUDA
    let mut count = -1;
    // SAFETY: a valid out-pointer; the message is read on the thread that failed.
    let message = unsafe {
        assert_eq!(
            accalloc_device_count_on(cuda, &mut count),
            AccallocStatus::ACCALLOC_ERROR_INVALID_ARGUMENT
        );
        CStr::from_ptr(accalloc_last_error_message())
            .to_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        message,
        "device type 1 does not exist in this process (known: 0 = host): CUDA is not in use \
         (ACCALLOC_DEVICE=host)"
    );
    assert_eq!(count, -1, "outputs are not written on failure");
}
