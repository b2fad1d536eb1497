// engine/gguf.cpp — GGUF v2/v3 parsing with every read bounds-checked (contract in gguf.h).
//
// File layout: "GGUF", u32 version, u64 n_tensors, u64 n_kv, n_kv x (string key, u32 type, value),
// n_tensors x (string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset), padding to
// general.alignment, then the data section. Strings are u64 length + bytes (no terminator).
#include "gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

namespace {

constexpr uint32_t GGUF_MAGIC = 0x46554747;      // "GGUF" little-endian
constexpr uint64_t GGUF_MAX_TENSORS = 1u << 20;  // far above any real model; bounds the index sizes
constexpr uint64_t GGUF_MAX_KV = 1u << 20;
constexpr uint64_t GGUF_MAX_STRING_BYTES = 1u << 26;  // 64 MiB: a chat template is the longest string
constexpr size_t GGUF_MAX_ALIGNMENT = 1u << 16;
constexpr int64_t GGUF_MAX_ELEMENTS = int64_t(1) << 40;  // per tensor

}  // namespace

std::string gguf_printable(std::string_view s) {
    constexpr size_t MAX_NAME_IN_ERROR = 80;
    std::string out;
    for (size_t i = 0; i < s.size() && i < MAX_NAME_IN_ERROR; ++i) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        out.push_back(c < 0x20 || c == 0x7F ? '?' : static_cast<char>(c));
    }
    if (s.size() > MAX_NAME_IN_ERROR) out += "...";
    return out;
}

namespace {

std::string printable(std::string_view s) { return gguf_printable(s); }

struct reader {
    const uint8_t* p;
    size_t size;
    size_t off = 0;
    std::string why;  // set on the first failure

    bool fail(const std::string& reason) {
        if (why.empty()) why = reason;
        return false;
    }
    bool need(size_t n) {
        if (n > size - off) return fail("truncated at byte " + std::to_string(off));
        return true;
    }
    template <typename T>
    bool get(T* v) {
        if (!need(sizeof(T))) return false;
        std::memcpy(v, p + off, sizeof(T));
        off += sizeof(T);
        return true;
    }
    bool get_string(std::string_view* s) {
        uint64_t n;
        if (!get(&n)) return false;
        if (n > GGUF_MAX_STRING_BYTES) return fail("string of " + std::to_string(n) + " bytes");
        if (!need(static_cast<size_t>(n))) return false;
        *s = std::string_view(reinterpret_cast<const char*>(p + off), static_cast<size_t>(n));
        off += static_cast<size_t>(n);
        return true;
    }
};

size_t scalar_size(uint32_t t) {
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

bool read_scalar(reader& r, uint32_t t, gguf_value* v) {
    switch (t) {
    case GGUF_TYPE_UINT8: { uint8_t x; if (!r.get(&x)) return false; v->i = x; break; }
    case GGUF_TYPE_INT8: { int8_t x; if (!r.get(&x)) return false; v->i = x; break; }
    case GGUF_TYPE_BOOL: { uint8_t x; if (!r.get(&x)) return false; v->i = x != 0; break; }
    case GGUF_TYPE_UINT16: { uint16_t x; if (!r.get(&x)) return false; v->i = x; break; }
    case GGUF_TYPE_INT16: { int16_t x; if (!r.get(&x)) return false; v->i = x; break; }
    case GGUF_TYPE_UINT32: { uint32_t x; if (!r.get(&x)) return false; v->i = x; break; }
    case GGUF_TYPE_INT32: { int32_t x; if (!r.get(&x)) return false; v->i = x; break; }
    case GGUF_TYPE_UINT64: {
        uint64_t x;
        if (!r.get(&x)) return false;
        v->i = x > uint64_t(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(x);
        break;
    }
    case GGUF_TYPE_INT64: { int64_t x; if (!r.get(&x)) return false; v->i = x; break; }
    case GGUF_TYPE_FLOAT32: { float x; if (!r.get(&x)) return false; v->f = x; return true; }
    case GGUF_TYPE_FLOAT64: { double x; if (!r.get(&x)) return false; v->f = x; return true; }
    default: return r.fail("unknown value type " + std::to_string(t));
    }
    v->f = static_cast<double>(v->i);
    return true;
}

bool read_value(reader& r, uint32_t t, gguf_value* v) {
    v->type = static_cast<gguf_value_type>(t);
    if (t == GGUF_TYPE_STRING) return r.get_string(&v->str);
    if (t != GGUF_TYPE_ARRAY) return read_scalar(r, t, v);
    uint32_t et;
    uint64_t n;
    if (!r.get(&et) || !r.get(&n)) return false;
    v->arr_type = static_cast<gguf_value_type>(et);
    v->arr_n = n;
    if (et == GGUF_TYPE_STRING) {
        // each element needs at least its 8-byte length: bound n by the bytes left before reserving
        if (n > (r.size - r.off) / 8) return r.fail("string array of " + std::to_string(n) + " past the end");
        v->strs.reserve(static_cast<size_t>(n));
        for (uint64_t i = 0; i < n; ++i) {
            std::string_view s;
            if (!r.get_string(&s)) return false;
            v->strs.push_back(s);
        }
        return true;
    }
    const size_t es = scalar_size(et);
    if (es == 0) return r.fail("unsupported array element type " + std::to_string(et));
    if (n > (r.size - r.off) / es) return r.fail("array of " + std::to_string(n) + " past the end");
    v->arr_data = r.p + r.off;
    r.off += static_cast<size_t>(n) * es;
    return true;
}

gguf_file* parse(const uint8_t* data, size_t size, const std::string& name, std::string* err) {
    auto fail = [&](const std::string& what) -> gguf_file* {
        if (err) *err = name + ": " + what;
        return nullptr;
    };
    reader r{data, size, 0, {}};
    uint32_t magic = 0, version = 0;
    uint64_t n_tensors = 0, n_kv = 0;
    if (!r.get(&magic)) return fail("not a GGUF file (" + r.why + ")");
    if (magic != GGUF_MAGIC) return fail("not a GGUF file (bad magic)");
    if (!r.get(&version)) return fail("header " + r.why);
    if (version != 2 && version != 3) return fail("unsupported GGUF version " + std::to_string(version));
    if (!r.get(&n_tensors) || !r.get(&n_kv)) return fail("header " + r.why);
    if (n_tensors > GGUF_MAX_TENSORS) return fail("implausible tensor count " + std::to_string(n_tensors));
    if (n_kv > GGUF_MAX_KV) return fail("implausible metadata count " + std::to_string(n_kv));

    auto* f = new gguf_file();
    f->version = version;
    f->file_size = size;
    f->base = data;
    f->path = name;
    auto bail = [&](const std::string& what) -> gguf_file* {
        delete f;
        return fail(what);
    };
    for (uint64_t i = 0; i < n_kv; ++i) {
        std::string_view key;
        uint32_t t;
        if (!r.get_string(&key)) return bail("metadata entry " + std::to_string(i) + ": " + r.why);
        gguf_value v;
        if (!r.get(&t) || !read_value(r, t, &v)) return bail("metadata '" + printable(key) + "': " + r.why);
        f->kv[std::string(key)] = std::move(v);
    }
    if (const gguf_value* a = gguf_find(f, "general.alignment")) {
        if (a->type != GGUF_TYPE_UINT32 && a->type != GGUF_TYPE_UINT64 && a->type != GGUF_TYPE_INT32) {
            return bail("general.alignment: not an integer");
        }
        if (a->i <= 0 || a->i > int64_t(GGUF_MAX_ALIGNMENT) || (a->i & (a->i - 1)) != 0) {
            return bail("general.alignment: bad value " + std::to_string(a->i));
        }
        f->alignment = static_cast<size_t>(a->i);
    }
    // each tensor entry needs at least 8 (name length) + 4 + 4 + 8 bytes
    if (n_tensors > (size - r.off) / 24) return bail("tensor table past the end of the file");
    f->tensors.reserve(static_cast<size_t>(n_tensors));
    for (uint64_t i = 0; i < n_tensors; ++i) {
        std::string_view tname;
        if (!r.get_string(&tname)) return bail("tensor entry " + std::to_string(i) + ": " + r.why);
        gguf_tensor t;
        t.name = std::string(tname);
        const std::string tn = "tensor '" + printable(t.name) + "': ";
        uint32_t type;
        if (!r.get(&t.n_dims)) return bail(tn + r.why);
        if (t.n_dims < 1 || t.n_dims > 4) return bail(tn + std::to_string(t.n_dims) + " dimensions");
        int64_t n_el = 1;
        for (uint32_t d = 0; d < t.n_dims; ++d) {
            uint64_t ne;
            if (!r.get(&ne)) return bail(tn + r.why);
            if (ne == 0 || ne > uint64_t(GGUF_MAX_ELEMENTS)) return bail(tn + "bad dimension " + std::to_string(ne));
            t.ne[d] = static_cast<int64_t>(ne);
            if (n_el > GGUF_MAX_ELEMENTS / t.ne[d]) return bail(tn + "too many elements");
            n_el *= t.ne[d];
        }
        if (!r.get(&type) || !r.get(&t.offset)) return bail(tn + r.why);
        if (!quant_supported(type)) return bail(tn + "unsupported tensor type " + std::to_string(type));
        t.type = static_cast<ggml_type>(type);
        if (t.ne[0] % quant_block_size(t.type) != 0) {
            return bail(tn + "row of " + std::to_string(t.ne[0]) + " not a multiple of the " +
                        quant_name(type) + " block");
        }
        t.n_bytes = quant_row_bytes(t.type, t.ne[0]) * static_cast<size_t>(n_el / t.ne[0]);
        if (t.offset % f->alignment != 0) return bail(tn + "misaligned data offset");
        if (f->tensor_index.count(t.name)) return bail(tn + "duplicate name");
        f->tensor_index[t.name] = f->tensors.size();
        f->tensors.push_back(std::move(t));
    }
    size_t data_off = r.off;
    if (data_off % f->alignment) data_off += f->alignment - data_off % f->alignment;
    if (data_off > size) return bail("data section past the end of the file");
    f->data_offset = data_off;
    const size_t data_size = size - data_off;
    for (gguf_tensor& t : f->tensors) {
        if (t.offset > data_size || t.n_bytes > data_size - t.offset) {
            return bail("tensor '" + printable(t.name) + "': data [" + std::to_string(t.offset) + ", +" +
                        std::to_string(t.n_bytes) + ") past the end of the file (truncated?)");
        }
        t.data = data + data_off + t.offset;
    }
    return f;
}

}  // namespace

gguf_file* gguf_open_buffer(const uint8_t* data, size_t size, const std::string& name, std::string* err) {
    return parse(data, size, name, err);
}

gguf_file* gguf_open(const std::string& path, std::string* err) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (err) *err = path + ": cannot open (" + std::strerror(errno) + ")";
        return nullptr;
    }
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        if (err) *err = path + ": not a regular file";
        return nullptr;
    }
    const size_t size = static_cast<size_t>(st.st_size);
    if (size < 8) {
        ::close(fd);
        if (err) *err = path + ": not a GGUF file (" + std::to_string(size) + " bytes)";
        return nullptr;
    }
    void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (addr == MAP_FAILED) {
        if (err) *err = path + ": mmap failed (" + std::strerror(errno) + ")";
        return nullptr;
    }
    gguf_file* f = parse(static_cast<const uint8_t*>(addr), size, path, err);
    if (!f) {
        ::munmap(addr, size);
        return nullptr;
    }
    f->map_addr = addr;
    f->map_size = size;
    return f;
}

void gguf_close(gguf_file* f) {
    if (!f) return;
    if (f->map_addr) ::munmap(f->map_addr, f->map_size);
    delete f;
}

const gguf_value* gguf_find(const gguf_file* f, const std::string& key) {
    auto it = f->kv.find(key);
    return it == f->kv.end() ? nullptr : &it->second;
}

const gguf_tensor* gguf_find_tensor(const gguf_file* f, const std::string& name) {
    auto it = f->tensor_index.find(name);
    return it == f->tensor_index.end() ? nullptr : &f->tensors[it->second];
}
