mod onnx;
