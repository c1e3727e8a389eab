// Harness for the patched sampling loop (openvino.genai 2026.3.0.0 + fix.patch), one request:
// 1. the draft's pass (validation off) samples a token from q and records q as its law;
// 2. the main model's pass (validation on) checks 2 drafted tokens against target logits for
//    3 positions (2 candidates + the bonus) and emits what it keeps plus one token.
// The first emitted token must follow p1 (the target's law at the first candidate's position),
// the second must follow p2 given the first, which here is checked as its marginal over runs
// where the first draft was kept; the draft laws q1, q2 differ from p1, p2.
#include <bits/stdc++.h>
#include "sampling/sampler.hpp"
using namespace ov::genai;

static std::vector<float> logits_of(const std::vector<float>& p) {
    std::vector<float> out;
    for (float x : p) out.push_back(x > 0 ? std::log(x) + 1.5f : -1e9f);
    return out;
}

int main(int argc, char** argv) {
    const size_t trials = argc > 1 ? std::stoul(argv[1]) : 50000;
    const size_t top_k = argc > 2 ? std::stoul(argv[2]) : 0;
    const size_t V = 6;
    std::vector<float> p1 = {0.35f, 0.25f, 0.16f, 0.10f, 0.14f, 0.00f}, q1 = {0.10f, 0.30f, 0.30f, 0.05f, 0.00f, 0.25f};
    std::vector<float> p2 = {0.05f, 0.40f, 0.00f, 0.30f, 0.20f, 0.05f}, q2 = {0.30f, 0.10f, 0.21f, 0.10f, 0.10f, 0.19f};
    std::vector<float> p3 = {0.20f, 0.20f, 0.20f, 0.20f, 0.10f, 0.10f};
    if (top_k) {  // keep the top_k of each law (the engine's law is then renormalised over them)
        for (auto* law : {&p1, &q1, &p2, &q2, &p3}) {
            std::vector<float> sorted(*law);
            std::sort(sorted.rbegin(), sorted.rend());
            float cut = sorted[top_k - 1];
            size_t kept = 0;
            for (auto& x : *law) { if (x < cut || kept == top_k || x == 0) x = 0; else ++kept; }
            float s = std::accumulate(law->begin(), law->end(), 0.0f);
            for (auto& x : *law) x /= s;
        }
    }
    GenerationConfig config;
    config.do_sample = true;
    config.temperature = 1.0f;
    if (top_k) config.top_k = top_k;
    config.num_assistant_tokens = 2;
    config.max_new_tokens = 100;
    config.ignore_eos = true;
    Sampler sampler;
    std::vector<size_t> first(V, 0), second(V, 0);
    size_t kept_first = 0, kept_both = 0, law_checked = 0;
    const TokenIds prompt{1, 2, 3};
    for (size_t t = 0; t < trials; ++t) {
        // --- the draft: two passes, each samples one token from its logits and records the law
        auto draft = std::make_shared<SequenceGroup>(0, prompt, config);
        auto dseq = draft->get_running_sequences()[0];
        dseq->append_token(4, 0.0f);  // a token the main model produced and validated
        Sampler::RequestSamplerContext dctx(1000000 + t, LogitProcessor(config, prompt, nullptr));
        for (const auto* q : {&q1, &q2}) {
            std::vector<float> row = logits_of(*q);
            ov::Tensor tensor(ov::element::f32, ov::Shape{1, 1, V}, row.data());
            draft->schedule_tokens(1);
            draft->set_num_validated_tokens(0);
            sampler.sample_from_sequence_group(draft, tensor, dctx, false);
            draft->finish_iteration();
        }
        if (dseq->get_generated_len() != 3) { std::puts("draft did not append 2 tokens"); return 2; }
#ifndef STOCK  // the stock engine records no law
        for (size_t pos : {size_t(1), size_t(2)}) {
            const DraftLaw* law = dseq->get_draft_law(pos);
            if (!law) { std::puts("draft recorded no law"); return 2; }
            const auto& q = pos == 1 ? q1 : q2;
            for (auto [id, prob] : *law) if (std::fabs(prob - q[id]) > 1e-5) { std::puts("recorded law differs from q"); return 2; }
            ++law_checked;
        }
#endif
        // --- the main model: the same tokens and laws (what update_request carries), 2 to validate
        auto main_group = std::make_shared<SequenceGroup>(0, prompt, config);
        auto mseq = main_group->get_running_sequences()[0];
        for (size_t i = 0; i < 3; ++i) {
            mseq->append_token(dseq->get_generated_ids()[i], dseq->get_generated_log_probs()[i]);
#ifndef STOCK
            if (auto law = dseq->get_draft_law(i)) mseq->set_draft_law(i, *law);
#endif
        }
        std::vector<float> rows;
        for (const auto* p : {&p1, &p2, &p3}) { auto r = logits_of(*p); rows.insert(rows.end(), r.begin(), r.end()); }
        ov::Tensor tensor(ov::element::f32, ov::Shape{1, 3, V}, rows.data());
        Sampler::RequestSamplerContext mctx(3000000 + t, LogitProcessor(config, prompt, nullptr));
        mctx.logit_processor.register_new_generated_token(4);
        main_group->schedule_tokens(3);
        main_group->set_num_validated_tokens(2);
        sampler.sample_from_sequence_group(main_group, tensor, mctx, true);
        const auto& out = mseq->get_generated_ids();
        const bool x1_kept = out.size() >= 3 && out[1] == dseq->get_generated_ids()[1];
        if (out.size() < 2 || out.size() > 4) { std::puts("main emitted a wrong number of tokens"); return 2; }
#ifndef STOCK
        if (!mseq->get_draft_laws().empty()) { std::puts("main kept draft laws after validation"); return 2; }
#endif
        ++first[out[1]];
        if (out.size() >= 3) { ++kept_first; ++second[out[2]]; }
        if (out.size() == 4) ++kept_both;
    }
    auto chi2 = [](const std::vector<size_t>& counts, const std::vector<float>& p, const char* name) {
        size_t n = std::accumulate(counts.begin(), counts.end(), size_t(0));
        double c = 0; size_t dof = 0; bool impossible = false;
        std::printf("%s (%zu draws):", name, n);
        for (size_t i = 0; i < p.size(); ++i) {
            std::printf(" %.3f/%.3f", double(counts[i]) / n, p[i]);
            if (p[i] > 0) { double e = p[i] * n; c += (counts[i] - e) * (counts[i] - e) / e; ++dof; }
            else if (counts[i]) impossible = true;
        }
        std::printf("  chi-square %.2f on %zu dof%s\n", c, dof - 1, impossible ? ", IMPOSSIBLE TOKEN" : "");
        const double limit[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52};  // 0.999 quantiles
        return !impossible && c < limit[dof - 1];
    };
    std::printf("laws recorded and checked: %zu; first draft kept %.4f (sum min(p1,q1) = %.4f)\n", law_checked,
                double(kept_first) / trials, [&] { double s = 0; for (size_t i = 0; i < V; ++i) s += std::min(p1[i], q1[i]); return s; }());
    bool ok = chi2(first, p1, "1st token vs p1");
    ok &= chi2(second, p2, "2nd token vs p2, when the 1st draft was kept");
    std::printf("%s\n", ok ? "OK" : "BROKEN");
    return ok ? 0 : 1;
}
