// engine/gguf.h — a GGUF v2/v3 reader over a read-only mmap.
//
// Contract:
//  - gguf_open maps the file and parses the header, the key/value metadata and the tensor table. Every
//    offset and length is checked against the file size before it is read; a truncated, corrupt or
//    unsupported file yields nullptr and one line in *err naming the file, the tensor (when there is one)
//    and the reason. Nothing here aborts, and the work is bounded by the file size (no count is trusted
//    before the bytes it claims are known to exist).
//  - Tensor data stays in the mapping: gguf_tensor::data points into it; nothing is copied.
//  - Knows nothing about architectures: model builders look tensors and keys up by name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cpu/quants.h"

enum gguf_value_type : uint32_t {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
};

// One metadata value. Scalars are widened into i/u/f; strings point into the mapping.
struct gguf_value {
    gguf_value_type type = GGUF_TYPE_UINT8;
    int64_t i = 0;        // integer and bool types
    double f = 0.0;       // float types (also set for integers)
    std::string_view str; // GGUF_TYPE_STRING
    // GGUF_TYPE_ARRAY: element type and count; string arrays are indexed in strs, numeric arrays keep the
    // raw little-endian bytes in arr_data (arr_n * element size bytes).
    gguf_value_type arr_type = GGUF_TYPE_UINT8;
    uint64_t arr_n = 0;
    const uint8_t* arr_data = nullptr;
    std::vector<std::string_view> strs;
};

struct gguf_tensor {
    std::string name;
    uint32_t n_dims = 0;
    int64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the contiguous (row) dimension
    ggml_type type = GGML_TYPE_F32;
    uint64_t offset = 0;           // relative to the data section
    size_t n_bytes = 0;
    const uint8_t* data = nullptr; // into the mapping
};

struct gguf_file {
    std::string path;
    uint32_t version = 0;
    size_t file_size = 0;
    const uint8_t* base = nullptr; // the mapping
    size_t alignment = 32;
    size_t data_offset = 0;        // start of the tensor data section
    std::unordered_map<std::string, gguf_value> kv;
    std::vector<gguf_tensor> tensors;
    std::unordered_map<std::string, size_t> tensor_index;  // name -> index in tensors
    void* map_addr = nullptr;      // owned mapping (nullptr for gguf_open_buffer)
    size_t map_size = 0;
};

// Opens and parses path; nullptr + *err (one line) on any failure.
gguf_file* gguf_open(const std::string& path, std::string* err);
// Parses an in-memory image (used by the fuzz test); the buffer must outlive the result.
gguf_file* gguf_open_buffer(const uint8_t* data, size_t size, const std::string& name, std::string* err);
void gguf_close(gguf_file* f);

const gguf_value* gguf_find(const gguf_file* f, const std::string& key);
const gguf_tensor* gguf_find_tensor(const gguf_file* f, const std::string& name);
// A string from the file as it may appear in an error line: control bytes shown as '?', at most 80 bytes.
std::string gguf_printable(std::string_view s);
