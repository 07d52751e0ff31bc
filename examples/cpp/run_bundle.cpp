// run_bundle - load an extracted .ascpack bundle with the C++ API and run it.
//
//   dir=$(python -m ascendc_pack_runtime extract model.ascpack)
//   ./run_bundle "$dir" [--inputs PREFIX] [--outputs PREFIX] [--repeat N] [--verify-hashes]
//                       [--inputs-after PREFIX] [--check-bad-inputs] [--host-cpu-flags "F1 F2 ..."]
//                       [--trusted-key KEY]... [--threads N]
//
// --inputs PREFIX reads input i from PREFIX<i>.bin (raw, contiguous, the dtype and shape of the
// manifest's input i); without it the inputs are random. --outputs PREFIX writes output i the
// same way to PREFIX<i>.bin, --inputs-after PREFIX the inputs after the first call (a model may
// mutate them in place). Prints the outputs' dtypes and shapes and the call latency.
// --check-bad-inputs also calls the model with a wrong input count, shape and dtype and prints
// how each call was rejected (std::invalid_argument). --host-cpu-flags checks the bundle's ISA
// against those CPU flags instead of this host's /proc/cpuinfo (LoadOptions::host_cpu_flags).
// --trusted-key (repeatable; ed25519:<hex> or a .pub file) sets LoadOptions::trusted_keys: the
// bundle must be signed by one of them. --threads N sets LoadOptions::threads (every call uses at
// most N threads) and at::set_num_threads(N) for the rest of the program, and prints the
// process's thread count after the calls.
// Exit status: 0 ok, 2 the bundle was refused (ascendc_pack::BundleError), 3 bad inputs.
#include <ascendc_pack/runtime.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

at::Tensor read_raw(const std::string& path, const ascendc_pack::TensorSpec& s) {
  at::Tensor t = at::empty(s.shape, at::TensorOptions().dtype(s.dtype));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("cannot open " + path);
  in.read(static_cast<char*>(t.data_ptr()), std::streamsize(t.nbytes()));
  if (size_t(in.gcount()) != t.nbytes() || in.peek() != EOF)
    throw std::invalid_argument(path + " does not hold exactly " + std::to_string(t.nbytes()) + " bytes for " + s.name);
  return t;
}

void write_raw(const std::string& path, const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(c.data_ptr()), std::streamsize(c.nbytes()));
}

at::Tensor random_input(const ascendc_pack::TensorSpec& s) {
  auto opt = at::TensorOptions().dtype(s.dtype);
  if (at::isFloatingType(s.dtype) || at::isComplexType(s.dtype)) return at::randn(s.shape, opt);
  if (s.dtype == at::kBool) return at::randint(0, 2, s.shape, opt);
  return at::randint(0, 10, s.shape, opt);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " DIR [--inputs PREFIX] [--outputs PREFIX] [--repeat N] [--verify-hashes]\n";
    return 1;
  }
  std::string dir = argv[1], in_prefix, out_prefix, after_prefix;
  int repeat = 1;
  bool check_bad = false;
  ascendc_pack::LoadOptions options;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--inputs" && i + 1 < argc) in_prefix = argv[++i];
    else if (a == "--outputs" && i + 1 < argc) out_prefix = argv[++i];
    else if (a == "--inputs-after" && i + 1 < argc) after_prefix = argv[++i];
    else if (a == "--repeat" && i + 1 < argc) repeat = std::max(1, std::atoi(argv[++i]));
    else if (a == "--verify-hashes") options.verify_hashes = true;
    else if (a == "--check-bad-inputs") check_bad = true;
    else if (a == "--host-cpu-flags" && i + 1 < argc) {
      std::istringstream words(argv[++i]);
      std::set<std::string> flags;
      for (std::string w; words >> w;) flags.insert(w);
      options.host_cpu_flags = flags;
    } else if (a == "--trusted-key" && i + 1 < argc) {
      if (!options.trusted_keys) options.trusted_keys.emplace();
      options.trusted_keys->push_back(argv[++i]);
    } else if (a == "--threads" && i + 1 < argc) options.threads = std::atoi(argv[++i]);
    else { std::cerr << "unknown argument " << a << "\n"; return 1; }
  }
  // the cap covers this program's own tensor work too (preparing inputs), not only the calls
  if (options.threads > 0) at::set_num_threads(options.threads);
  try {
    auto t0 = std::chrono::steady_clock::now();
    auto model = ascendc_pack::Model::load(dir, options);
    double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::vector<at::Tensor> inputs;
    const auto& specs = model->input_specs();
    for (size_t i = 0; i < specs.size(); ++i)
      inputs.push_back(in_prefix.empty() ? random_input(specs[i]) : read_raw(in_prefix + std::to_string(i) + ".bin", specs[i]));
    std::vector<at::Tensor> pristine;
    for (const auto& t : inputs) pristine.push_back(t.clone());
    std::vector<at::Tensor> outputs;
    std::vector<double> ms;
    for (int r = 0; r < repeat; ++r) {
      // the first call gets the inputs themselves (a mutation reaches them), later ones fresh copies
      std::vector<at::Tensor> call_in = inputs;
      if (r > 0)
        for (size_t i = 0; i < call_in.size(); ++i) call_in[i] = pristine[i].clone();
      auto t = std::chrono::steady_clock::now();
      std::vector<at::Tensor> out = model->run(call_in);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
      if (r == 0) outputs = out;
    }
    std::sort(ms.begin(), ms.end());
    if (!after_prefix.empty())
      for (size_t i = 0; i < inputs.size(); ++i) write_raw(after_prefix + std::to_string(i) + ".bin", inputs[i]);
    std::printf("model %s: loaded in %.2f ms\n", model->name().c_str(), load_ms);
    for (size_t o = 0; o < outputs.size(); ++o) {
      std::printf("output %zu (%s): %s %s\n", o, model->output_specs()[o].name.c_str(),
                  c10::toString(outputs[o].scalar_type()), c10::str(outputs[o].sizes()).c_str());
      if (!out_prefix.empty()) write_raw(out_prefix + std::to_string(o) + ".bin", outputs[o]);
    }
    std::printf("latency p50 %.3f ms over %d call(s)\n", ms[ms.size() / 2], repeat);
    if (options.threads > 0) {
      std::ifstream status("/proc/self/status");
      std::string line;
      while (std::getline(status, line))
        if (line.rfind("Threads:", 0) == 0) std::printf("threads: cap %d, process %d\n", options.threads, std::atoi(line.c_str() + 8));
    }
    if (check_bad && !inputs.empty()) {
      std::vector<std::vector<at::Tensor>> bad(3, pristine);
      bad[0].pop_back();                                               // wrong count
      bad[1][0] = at::zeros({3}, at::TensorOptions().dtype(specs[0].dtype));   // wrong shape
      bad[2][0] = pristine[0].to(specs[0].dtype == at::kDouble ? at::kFloat : at::kDouble);  // wrong dtype
      for (auto& b : bad) {
        try {
          model->run(b);
          std::printf("accepted a bad call\n");
          return 4;
        } catch (const std::invalid_argument& e) {
          std::printf("rejected: %s\n", e.what());
        }
      }
    }
  } catch (const ascendc_pack::BundleError& e) {
    std::fprintf(stderr, "refused: %s\n", e.what());
    return 2;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "bad input: %s\n", e.what());
    return 3;
  }
  return 0;
}
