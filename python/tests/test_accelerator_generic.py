"""Device-generic tests of torch.accelerator, written as PyTorch writes its own (test/test_accelerator.py):
a TestCase instantiated by instantiate_device_type_tests, which adds a variant for the PrivateUse1
device (here accalloc's host accelerator) because it is registered. Each test takes `device` and uses
only torch.accelerator's API, so it would run unchanged on CUDA, XPU or MPS."""
import gc
import unittest

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import TestCase

import conftest  # noqa: F401  (registers the accelerator before the tests are instantiated)


class TestAcceleratorGeneric(TestCase):
    def test_the_device_is_the_current_accelerator(self, device):
        accelerator = torch.accelerator.current_accelerator()
        self.assertEqual(accelerator.type, self.device_type)
        self.assertIsNone(accelerator.index)
        self.assertTrue(torch.accelerator.is_available())
        with self.assertRaisesRegex(ValueError, "doesn't match the current accelerator"):
            torch.accelerator.set_device_index("cpu")

    def test_switching_devices(self, device):
        if torch.accelerator.device_count() < 2:
            self.skipTest("one device")
        start = torch.accelerator.current_device_index()
        other = (start + 1) % torch.accelerator.device_count()
        torch.accelerator.set_device_index(other)
        self.assertEqual(torch.accelerator.current_device_index(), other)
        stream = torch.Stream(other)
        torch.accelerator.set_stream(stream)
        torch.accelerator.synchronize(start)
        self.assertEqual(torch.accelerator.current_device_index(), other)
        torch.accelerator.set_device_index(start)
        self.assertEqual(torch.accelerator.current_device_index(), start)

    def test_device_index_contexts(self, device):
        start = torch.accelerator.current_device_index()
        with torch.accelerator.device_index(None):
            self.assertEqual(torch.accelerator.current_device_index(), start)
        with torch.accelerator.device_index(0):
            self.assertEqual(torch.accelerator.current_device_index(), 0)
            if torch.accelerator.device_count() > 1:
                with torch.accelerator.device_index(1):
                    self.assertEqual(torch.accelerator.current_device_index(), 1)
                self.assertEqual(torch.accelerator.current_device_index(), 0)
        self.assertEqual(torch.accelerator.current_device_index(), start)

    def test_streams_and_events(self, device):
        first, second = torch.Stream(), torch.Stream()
        torch.accelerator.set_stream(first)
        self.assertEqual(torch.accelerator.current_stream(), first)
        x, y = torch.randn(500), torch.randn(500)
        torch.accelerator.set_stream(second)
        x_device = x.to(device, non_blocking=True)
        y_device = y.to(device, non_blocking=True)
        event = torch.Event()
        event.record(second)
        event.synchronize()
        self.assertTrue(event.query())
        torch.accelerator.set_stream(first)
        total = x_device + y_device
        torch.accelerator.synchronize()
        self.assertEqual(total.cpu(), x + y)
        stream = torch.accelerator.current_stream()
        self.assertEqual(torch.accelerator.current_stream(stream.device), stream)
        self.assertEqual(torch.accelerator.current_stream(stream.device.index), stream)
        self.assertEqual(torch.accelerator.current_stream(str(stream.device)), stream)
        with self.assertRaisesRegex(ValueError, "doesn't match the current accelerator"):
            torch.accelerator.current_stream(torch.device("cpu"))

    def test_stream_contexts(self, device):
        before = torch.accelerator.current_stream()
        with torch.Stream() as inner:
            self.assertEqual(torch.accelerator.current_stream(), inner)
        self.assertEqual(torch.accelerator.current_stream(), before)

    def test_a_non_blocking_copy_to_the_cpu_is_pinned(self, device):
        on_device = torch.randn(100).to(device)
        on_host = on_device.to("cpu", non_blocking=True)
        torch.accelerator.synchronize()
        self.assertTrue(on_host.is_pinned())
        self.assertEqual(on_device.cpu(), on_host)
        self.assertFalse(torch.randn(10).is_pinned())

    def test_memory_stats(self, device):
        scratch = torch.randn(100, device=device)
        del scratch
        gc.collect()
        self.assertTrue(torch._C._accelerator_isAllocatorInitialized())
        torch.accelerator.empty_cache()
        stats = torch.accelerator.memory_stats()
        for family in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes"):
            for pool in ("all", "small_pool", "large_pool"):
                for field in ("current", "peak", "allocated", "freed"):
                    self.assertIn(f"{family}.{pool}.{field}", stats)
        allocated, reserved = torch.accelerator.memory_allocated(), torch.accelerator.memory_reserved()
        self.assertGreater(torch.accelerator.max_memory_allocated(), 0)
        self.assertGreater(torch.accelerator.max_memory_reserved(), 0)
        ones = torch.ones(256, device=device)
        self.assertGreater(torch.accelerator.memory_allocated(), allocated)
        self.assertGreaterEqual(torch.accelerator.memory_reserved(), reserved)
        del ones
        gc.collect()
        torch.accelerator.empty_cache()
        torch.accelerator.reset_peak_memory_stats()
        self.assertEqual(torch.accelerator.memory_allocated(), allocated)
        self.assertEqual(torch.accelerator.memory_reserved(), reserved)
        torch.accelerator.reset_accumulated_memory_stats()
        active = torch.accelerator.memory_stats()["active_bytes.all.current"]
        kib = torch.randn(256, device=device)  # 1 KiB: two 512-byte steps
        self.assertEqual(torch.accelerator.memory_stats()["active_bytes.all.current"], active + 1024)
        self.assertEqual(torch.accelerator.memory_stats()["active_bytes.all.freed"], 0)
        del kib
        gc.collect()
        torch.accelerator.empty_cache()
        self.assertEqual(torch.accelerator.memory_stats()["active_bytes.all.current"], active)
        self.assertEqual(torch.accelerator.memory_stats()["active_bytes.all.freed"], 1024)

    def test_get_memory_info(self, device):
        free, total = torch.accelerator.get_memory_info()
        self.assertGreater(total, 0)
        self.assertGreaterEqual(free, 0)
        self.assertLessEqual(free, total)

    def test_empty_host_cache(self, device):
        torch.accelerator.empty_host_cache()

    def test_eager_compile_in_a_device_context(self, device):
        def step(x):
            with torch.accelerator.device_index(x.device.index):
                return torch.sin(x + 1)

        x = torch.randn((2, 2), device=device)
        expected = step(x)
        compiled = torch.compile(backend="eager", fullgraph=True)(step)
        self.assertEqual(compiled(x), expected)


instantiate_device_type_tests(TestAcceleratorGeneric, globals(), except_for=("cpu",))


class TestTheVariantExists(unittest.TestCase):
    def test_the_privateuse1_variant_was_instantiated(self):
        self.assertIn("TestAcceleratorGenericPRIVATEUSE1", globals())
