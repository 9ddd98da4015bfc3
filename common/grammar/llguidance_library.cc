#include "common/grammar/llguidance_library.h"

#include <dlfcn.h>

#include <filesystem>

namespace tessera {

namespace {

template <typename F>
Status Resolve(void* handle, const std::string& path, const char* name, F* out) {
  dlerror();
  void* sym = dlsym(handle, name);
  if (sym == nullptr)
    return FailedPrecondition(path + " does not export " + name +
                              " (not LLGuidance's C API, or a version without it)");
  *out = reinterpret_cast<F>(sym);
  return Status::Ok();
}

}  // namespace

StatusOr<std::shared_ptr<const LlguidanceLibrary>> LlguidanceLibrary::Load(
    const std::string& llguidance_library, const std::string& python_library) {
  if (llguidance_library.empty() || !std::filesystem::exists(llguidance_library))
    return NotFound("the LLGuidance library '" + llguidance_library +
                    "' (structured_output.llguidance_library) does not exist: run scripts/setup, "
                    "which unpacks it from the llguidance wheel into the cache");
  std::shared_ptr<LlguidanceLibrary> lib(new LlguidanceLibrary());
  lib->path_ = llguidance_library;
  lib->python_ = dlopen(python_library.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (lib->python_ == nullptr)
    return FailedPrecondition("the Python library '" + python_library +
                              "' (structured_output.python_library), whose symbols the LLGuidance "
                              "library references, does not load: " +
                              dlerror());
  lib->handle_ = dlopen(llguidance_library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib->handle_ == nullptr)
    return FailedPrecondition("the LLGuidance library '" + llguidance_library +
                              "' does not load: " + dlerror());
  const std::string& p = lib->path_;
  void* h = lib->handle_;
  TESSERA_RETURN_IF_ERROR(Resolve(h, p, "llg_new_tokenizer", &lib->new_tokenizer));
  TESSERA_RETURN_IF_ERROR(Resolve(h, p, "llg_free_tokenizer", &lib->free_tokenizer));
  TESSERA_RETURN_IF_ERROR(
      Resolve(h, p, "llg_constraint_init_set_defaults", &lib->constraint_init_set_defaults));
  TESSERA_RETURN_IF_ERROR(Resolve(h, p, "llg_new_matcher", &lib->new_matcher));
  TESSERA_RETURN_IF_ERROR(Resolve(h, p, "llg_matcher_get_error", &lib->matcher_get_error));
  TESSERA_RETURN_IF_ERROR(
      Resolve(h, p, "llg_matcher_get_mask_byte_size", &lib->matcher_get_mask_byte_size));
  TESSERA_RETURN_IF_ERROR(
      Resolve(h, p, "llg_matcher_compute_mask_into", &lib->matcher_compute_mask_into));
  TESSERA_RETURN_IF_ERROR(Resolve(h, p, "llg_matcher_consume_token", &lib->matcher_consume_token));
  TESSERA_RETURN_IF_ERROR(Resolve(h, p, "llg_free_matcher", &lib->free_matcher));
  return std::shared_ptr<const LlguidanceLibrary>(std::move(lib));
}

// The libraries stay loaded: LLGuidance's worker threads (rayon) may outlive
// the last handle, and unloading under them would crash at exit.
LlguidanceLibrary::~LlguidanceLibrary() = default;

}  // namespace tessera
