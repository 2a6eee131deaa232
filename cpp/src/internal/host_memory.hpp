// Host memory for fourd's own buffers: scratch of the backends and algorithms, the staging of
// persistent MPI requests, and the buffers tuning explores on in place of a call's
// (operation.cpp). Backend-neutral: every host path allocates through these.
#pragma once

#include <cstddef>
#include <memory>

namespace fourd::detail {

/// Host memory for scratch: 64-byte aligned (2 MiB and advised for huge pages from 2 MiB),
/// every page written now, so the first operations do not pay the page faults.
std::shared_ptr<void> allocateHost(size_t bytes);

/// Whether the host memory at `p` lies in a mapping that transparent huge pages back or may
/// back (Linux: the mapping's AnonHugePages or THPeligible in /proc/self/smaps); false where
/// that cannot be read. Reads smaps up to the mapping: milliseconds in a large process.
bool onHugePages(const void* p);

/// Host memory of at least `bytes` (64-byte aligned), every page written with zeros, and, from
/// 2 MiB, backed as the `likeBytes` at `like` are: 2 MiB aligned and advised for huge pages
/// where onHugePages() of their middle (an allocator's first page, with its header, is often a
/// mapping of its own), advised against them where not. Tuning's explorations run on such
/// buffers in place of the call's (operation.cpp): at 64 MiB every algorithm ran 1.6-2.2x
/// slower on small pages than on huge ones (bench/huge_pages.py), so buffers paged unlike the
/// call's misjudge it.
std::shared_ptr<void> allocateHostLike(size_t bytes, const void* like, size_t likeBytes);

}  // namespace fourd::detail
